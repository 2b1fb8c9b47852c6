"""The compiled hot path: the modules that run once per batch change, built with mypyc.

kvsim is plain Python, and the sources are the reference. ``kvsim native build`` (run by
``./dev setup``) compiles :data:`MODULES` into C extensions with mypyc, which turns their
classes into native ones (attributes at fixed offsets, typed locals, direct calls between
compiled functions); Python then imports the extensions in place of the sources. The results
are bit-identical (``tests/test_native.py`` compares whole-run summaries byte for byte); the
speed-up is measured in ``docs/performance.md``.

A build is only used while it matches the sources. On ``import sim``, :func:`guard` compares
every compiled module's source with the hash recorded at build time; on any difference it
warns and imports the sources instead, so an edited module is never shadowed by a stale
extension. ``KVSIM_NATIVE=0`` forces the sources (the interpreted reference, and what
``bench opcount`` and ``bench profile`` measure).

    kvsim native build     # compile (needs mypy's mypyc and a C compiler; ./dev setup runs it)
    kvsim native status    # compiled | stale | absent | off
    kvsim native clean     # remove the extensions
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = PACKAGE_DIR.parent
#: Compiled together, so calls between them are direct C calls. Every class in them that a
#: module outside this list subclasses is marked ``allow_interpreted_subclasses``.
MODULES = (
    "sim.request",
    "sim.cost.model",
    "sim.cost.profile",
    "sim.cost.profile_model",
    "sim.allocators.base",
    "sim.allocators.cohort",
    "sim.allocators.paged",
    "sim.allocators.placement",
    "sim.allocators.compaction",
    "sim.allocators.static",
    "sim.allocators.dynamic",
    "sim.allocators.tiered",
    "sim.allocators.hybrid_tail",
    "sim.allocators.hybrid_reserve",
    "sim.sched.continuous",
    "sim.output.metrics",
    "sim.engine.router",
    "sim.engine.simpy_shortcuts",
    "sim.engine.stats",
    "sim.engine.replica",
    "sim.engine.cluster",
)
#: The shared library that holds the compiled code (the per-module extensions are shims).
GROUP = "sim._native"
MANIFEST = PACKAGE_DIR / "_native.json"
ENV = "KVSIM_NATIVE"


class NativeBuildError(RuntimeError):
    """The compiled hot path could not be built; the sources still run."""


def _source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extensions() -> list[Path]:
    """Extension files of a build in the source tree (the modules' and the shared library)."""
    out = []
    for mod in (*MODULES, GROUP + "__mypyc"):
        src = _source(mod)
        out += sorted(src.parent.glob(src.stem + ".*.so")) + sorted(src.parent.glob(src.stem + ".*.pyd"))
    return out


def state() -> str:
    """``off`` (``KVSIM_NATIVE=0``), ``absent`` (no build), ``stale`` (a source changed since the
    build) or ``compiled``."""
    if os.environ.get(ENV, "1") == "0":
        return "off"
    if not extensions():
        return "absent"
    try:
        recorded = json.loads(MANIFEST.read_text())["sources"]
    except (OSError, ValueError, KeyError):
        return "stale"
    for mod in MODULES:
        src = _source(mod)
        if recorded.get(mod) != (_hash(src) if src.exists() else None):
            return "stale"
    return "compiled"


def active() -> bool:
    """Whether the engine in this process runs compiled (the hot modules import as extensions)."""
    # Where the import system finds (or found) the replica module, without importing the engine
    # from this low layer.
    mod = sys.modules.get("sim.engine.replica")
    origin = (
        getattr(mod, "__file__", None)
        if mod is not None
        else getattr(importlib.util.find_spec("sim.engine.replica"), "origin", None)
    )
    return origin is not None and not str(origin).endswith(".py")


class SourceFinder(importlib.abc.MetaPathFinder):
    """Imports the compiled modules from their ``.py`` files, ahead of any extension."""

    def find_spec(self, name, path=None, target=None):
        if name in MODULES:
            return importlib.util.spec_from_file_location(name, _source(name))
        return None


def guard() -> str:
    """Called on ``import sim``: use the sources unless an up-to-date build exists. Returns the state
    (``sim.NATIVE_STATE``: the engine this process runs)."""
    st = state()
    if st in ("off", "stale"):
        if st == "stale":
            warnings.warn(
                "kvsim: the compiled hot path is older than its sources; running the sources "
                "(rebuild with `kvsim native build`, or `./dev setup`)",
                RuntimeWarning,
                stacklevel=3,
            )
        if not any(isinstance(f, SourceFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, SourceFinder())
    return st


def clean() -> int:
    """Remove a build from the source tree; returns how many files went."""
    files = extensions()
    for f in files:
        f.unlink()
    MANIFEST.unlink(missing_ok=True)
    return len(files)


_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
paths, opt, c_dir, group = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
setup(name="kvsim-native", packages=[], py_modules=[],
      ext_modules=mypycify(paths, opt_level=opt, target_dir=c_dir, group_name=group),
      script_args=["-q", "build_ext", "--inplace", "--build-temp", c_dir + "/tmp", "--build-lib", c_dir + "/lib"])
"""


def build(opt_level: str = "3", log=None) -> list[Path]:
    """Compile :data:`MODULES` into the source tree (about a minute on two cores) and record the
    sources' hashes. Raises :class:`NativeBuildError` with the compiler's last lines on failure;
    a failed build leaves no extension behind."""
    try:
        import mypyc  # noqa: F401  (mypy ships it)
    except ImportError:
        raise NativeBuildError("mypyc is not installed: pip install 'mypy>=1.10' (the `native` extra)") from None
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None and shutil.which("gcc") is None:
        raise NativeBuildError(f"no C compiler ({cc!r} or 'gcc') on PATH")
    clean()
    paths = [str(_source(m).relative_to(ROOT)) for m in MODULES]
    with tempfile.TemporaryDirectory(prefix="kvsim-native-") as tmp:
        # In the tree's root: mypy names modules from their paths, and pyproject.toml holds its options.
        proc = subprocess.run(
            [sys.executable, "-c", _SETUP, ",".join(paths), opt_level, tmp, GROUP],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    if log is not None:
        log(proc.stdout + proc.stderr)
    built = extensions()
    if proc.returncode != 0 or len(built) != len(MODULES) + 1:
        clean()
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise NativeBuildError(f"mypyc build failed (exit {proc.returncode}):\n{tail}")
    MANIFEST.write_text(
        json.dumps(
            {
                "sources": {m: _hash(_source(m)) for m in MODULES},
                "python": sys.version.split()[0],
                "opt_level": opt_level,
            },
            indent=1,
        )
        + "\n"
    )
    return built
