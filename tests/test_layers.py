"""The package layout reads top-down: no import cycles between sim's sub-packages, and the
simulator core never imports the analysis, CLI or explorer layers (nor torch)."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parent.parent / "sim"

#: Lower layers first; a module may import only from its own layer or those before it.
LAYERS = [
    {
        "errors",
        "limits",
        "strict",
        "inputs",
        "package_data",
        "config",
        "catalog",
        "hf_config",
        "hf_defaults",
        "model_ids",
        "request",
        "native",
        "__init__",
        "engine_presets",
    },
    {"workload", "cost"},
    {"allocators"},
    {"sched", "output"},
    {"engine"},
    {"analysis"},
    {"cli", "explorer"},
]


def _unit(path: Path) -> str:
    """The sub-package (or top-level module) a file belongs to."""
    rel = path.relative_to(SIM)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> set[str]:
    """sim units imported at run time (imports under ``if TYPE_CHECKING:`` are type-only)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            parts = n.split(".")
            if (
                parts[0] == "sim"
                and len(parts) > 1
                and ((SIM / parts[1]).is_dir() or (SIM / f"{parts[1]}.py").exists())
            ):
                out.add(parts[1])
    return out


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for f in SIM.rglob("*.py"):
        u = _unit(f)
        g.setdefault(u, set()).update(_imports(f) - {u})
    return g


def test_no_relative_imports_in_sim():
    bad = [
        str(f)
        for f in SIM.rglob("*.py")
        for n in ast.walk(ast.parse(f.read_text()))
        if isinstance(n, ast.ImportFrom) and n.level > 0
    ]
    assert not bad, bad


def test_layers_import_downwards_only():
    layer = {u: i for i, us in enumerate(LAYERS) for u in us}
    g = _graph()
    assert set(g) <= set(layer), f"unplaced units: {set(g) - set(layer)}"
    upward = [(u, v) for u, vs in g.items() for v in vs if layer[v] > layer[u]]
    assert not upward, f"imports against the data flow: {upward}"


def test_no_cycles_between_packages():
    g = _graph()
    state: dict[str, int] = {}

    def visit(u, stack):
        state[u] = 1
        for v in g.get(u, ()):
            if state.get(v) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(stack + [u, v])}")
            if not state.get(v):
                visit(v, stack + [u])
        state[u] = 2

    for u in list(g):
        if not state.get(u):
            visit(u, [])


def test_sim_never_imports_torch():
    for f in SIM.rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            mods = (
                [a.name for a in n.names]
                if isinstance(n, ast.Import)
                else [n.module or ""]
                if isinstance(n, ast.ImportFrom)
                else []
            )
            assert not any(m.split(".")[0] == "torch" for m in mods), f"{f} imports torch"
