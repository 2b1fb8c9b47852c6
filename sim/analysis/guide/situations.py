"""The seed article's situations, read from ``scenarios/guide/*.yaml`` and validated.

One file per situation, named by its key (the stem of the scenario it runs), e.g.
``scenarios/guide/long-context.yaml``::

    number: "2"                      # its place in the guide (sorted as 1, 2, …, 12a, 12b)
    title: "Long context: ten concurrent 16K prompts"
    scenario: long-context           # scenarios/long-context.yaml
    question: "..."
    slo: {ttft_s: 15.0, tpot_s: 0.06}
    variants:                        # each one a simulation of the scenario with --set overrides
      - {name: static, strategy: "static: ...", set: {allocator.kind: static, ...}}
      - {name: paged@4x, strategy: "...", contrast: true, set: {...}}   # shown, not a candidate
    claims:                          # the article's words and the check that tests them
      - id: long-gate
        article: "Run ten 16K prompts concurrently and ..."
        check: long_gate             # a function of sim.analysis.guide.claims.CHECKS
        variants: {static: static, dynamic: dynamic-chunk}   # its arguments → variant names
    columns:                         # extra per-variant columns (sim.analysis.guide.render.COLUMNS)
      - {header: "KV at gate (GiB)", value: kv_at_gate_gib}
    requires_model: flan-t5-xl       # optional: skip the situation while the catalog lacks it

Everything is checked on load (:func:`load_situations`), so a typo fails with the file, the key,
the value and what is allowed (:class:`sim.errors.ConfigError`) before anything is simulated:
unknown keys, duplicate variant names or claim ids, a check or column that does not exist, a
claim whose variants do not match its check's arguments or name a variant the situation lacks.
Whether every variant's overrides are valid scenario keys is checked by ``tests/test_scenarios.py``
(it needs the scenario files themselves).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sim.analysis.guide.claims import CHECKS, ClaimResult
from sim.analysis.guide.render import COLUMNS
from sim.analysis.guide.runs import SituationResult
from sim.analysis.slo import SLO
from sim.config import SCENARIO_DIR
from sim.errors import ConfigError

GUIDE_DIR = SCENARIO_DIR / "guide"


@dataclass(frozen=True)
class Variant:
    name: str
    #: Dotted scenario keys → values, in the order written (as ``--set`` would take them).
    overrides: dict
    strategy: str
    #: A contrast run (another load or workload): shown, but not a candidate for the recommendation.
    contrast: bool = False


@dataclass(frozen=True)
class Claim:
    id: str
    #: The article's words.
    article: str
    #: Name of the check in :data:`sim.analysis.guide.claims.CHECKS`.
    check_name: str
    #: The check's arguments → a variant name, or a tuple of them for a ``list[Run]`` argument.
    variants: dict

    def check(self, r: SituationResult) -> ClaimResult:
        """The check on the situation's runs (``r`` must hold every variant the claim names)."""
        args = {
            role: [r[n] for n in names] if isinstance(names, tuple) else r[names]
            for role, names in self.variants.items()
        }
        return CHECKS[self.check_name](**args)


@dataclass(frozen=True)
class Column:
    header: str
    #: Name of the function in :data:`sim.analysis.guide.render.COLUMNS`.
    value: str
    #: Its other keys (e.g. ``format``, ``reference``).
    args: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Situation:
    key: str
    number: str
    title: str
    scenario: str
    question: str
    variants: tuple[Variant, ...]
    slo: SLO
    claims: tuple[Claim, ...] = ()
    columns: tuple[Column, ...] = ()
    #: A catalog model the scenario needs; while it is missing the situation is skipped.
    requires_model: str | None = None


# --- the file format ---------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _SLO(_Strict):
    ttft_s: float | None = Field(None, gt=0)
    tpot_s: float | None = Field(None, gt=0)
    e2e_s: float | None = Field(None, gt=0)
    attainment: float = Field(0.9, gt=0, le=1)


class _Variant(_Strict):
    name: str = Field(min_length=1)
    strategy: str
    overrides: dict[str, Any] = Field(default_factory=dict, alias="set")
    contrast: bool = False


class _Claim(_Strict):
    id: str = Field(min_length=1)
    article: str
    check: str
    variants: dict[str, str | list[str]]


class _Column(BaseModel):
    model_config = ConfigDict(extra="allow")  # the extra keys are the column function's arguments
    header: str
    value: str


class _Situation(_Strict):
    number: str = Field(pattern=r"^\d+[a-z]?$")
    title: str
    scenario: str
    question: str
    slo: _SLO
    variants: list[_Variant] = Field(min_length=1)
    claims: list[_Claim] = Field(default_factory=list)
    columns: list[_Column] = Field(default_factory=list)
    requires_model: str | None = None


def _where(path: Path, *keys: object) -> str:
    return f"{path.name}: " + ".".join(str(k) for k in keys) if keys else path.name


def _params(fn, skip: int) -> dict[str, inspect.Parameter]:
    return dict(list(inspect.signature(fn).parameters.items())[skip:])


def _claim(path: Path, i: int, spec: _Claim, names: set[str]) -> Claim:
    key = _where(path, "claims", i)
    if spec.check not in CHECKS:
        raise ConfigError(f"{key}.check", spec.check, f"one of {', '.join(sorted(CHECKS))}")
    roles = _params(CHECKS[spec.check], 0)
    if set(spec.variants) != set(roles):
        raise ConfigError(
            f"{key}.variants", sorted(spec.variants), f"exactly the arguments of check {spec.check}: {', '.join(roles)}"
        )
    bound: dict[str, str | tuple[str, ...]] = {}
    for role, p in roles.items():  # in the check's order, so findings list runs as the check does
        val = spec.variants[role]
        many = str(p.annotation).startswith("list[")
        if many != isinstance(val, list):
            raise ConfigError(f"{key}.variants.{role}", val, "a list of variant names" if many else "one variant name")
        for n in val if isinstance(val, list) else [val]:
            if n not in names:
                raise ConfigError(
                    f"{key}.variants.{role}", n, f"a variant of this situation ({', '.join(sorted(names))})"
                )
        bound[role] = tuple(val) if isinstance(val, list) else val
    return Claim(spec.id, spec.article, spec.check, bound)


def _column(path: Path, i: int, spec: _Column, names: set[str]) -> Column:
    key = _where(path, "columns", i)
    if spec.value not in COLUMNS:
        raise ConfigError(f"{key}.value", spec.value, f"one of {', '.join(sorted(COLUMNS))}")
    args = dict(spec.model_extra or {})
    params = _params(COLUMNS[spec.value], 2)
    for k in args:
        if k not in params:
            raise ConfigError(
                f"{key}.{k}",
                args[k],
                f"a key of column {spec.value}: header, value" + "".join(f", {p}" for p in params),
            )
    missing = [p for p, v in params.items() if v.default is inspect.Parameter.empty and p not in args]
    if missing:
        raise ConfigError(key, spec.value, f"column {spec.value} needs {', '.join(missing)}")
    if "reference" in args and args["reference"] not in names:
        raise ConfigError(
            f"{key}.reference", args["reference"], f"a variant of this situation ({', '.join(sorted(names))})"
        )
    return Column(spec.header, spec.value, args)


def read_situation(path: Path) -> Situation:
    """One situation file, validated (:class:`ConfigError` on the first problem)."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(path.name, "(file)", f"valid YAML ({str(exc).splitlines()[0]})") from None
    try:
        spec = _Situation.model_validate(data)
    except ValidationError as err:
        errs = err.errors()
        # An unknown key first: a misspelt key also shows up as the required one missing.
        e = next((x for x in errs if x["type"] == "extra_forbidden"), errs[0])
        where = _where(path, *e["loc"])
        if e["type"] == "extra_forbidden":
            raise ConfigError(where, e.get("input"), "unknown key") from None
        if e["type"] == "missing":
            raise ConfigError(where, None, "a required key") from None
        raise ConfigError(where, e.get("input"), e["msg"].removeprefix("Value error, ")) from None
    if not (SCENARIO_DIR / f"{spec.scenario}.yaml").is_file():
        raise ConfigError(_where(path, "scenario"), spec.scenario, "the name of a file in scenarios/")
    names: set[str] = set()
    for i, v in enumerate(spec.variants):
        if v.name in names:
            raise ConfigError(_where(path, "variants", i, "name"), v.name, "a name no other variant has")
        names.add(v.name)
    ids = [c.id for c in spec.claims]
    for i, c in enumerate(ids):
        if c in ids[:i]:
            raise ConfigError(_where(path, "claims", i, "id"), c, "an id no other claim of the situation has")
    return Situation(
        key=path.stem,
        number=spec.number,
        title=spec.title,
        scenario=spec.scenario,
        question=spec.question,
        variants=tuple(Variant(v.name, dict(v.overrides), v.strategy, v.contrast) for v in spec.variants),
        slo=SLO(**spec.slo.model_dump()),
        claims=tuple(_claim(path, i, c, names) for i, c in enumerate(spec.claims)),
        columns=tuple(_column(path, i, c, names) for i, c in enumerate(spec.columns)),
        requires_model=spec.requires_model,
    )


def _order(s: Situation) -> tuple[int, str]:
    m = re.match(r"(\d+)(.*)", s.number)
    assert m is not None  # the schema's pattern
    return int(m.group(1)), m.group(2)


def load_situations(directory: Path = GUIDE_DIR) -> tuple[Situation, ...]:
    """Every ``*.yaml`` in ``directory``, validated, in the guide's order (by ``number``)."""
    sits = [read_situation(p) for p in sorted(directory.glob("*.yaml"))]
    seen: dict[str, str] = {}
    for s in sits:
        if s.number in seen:
            raise ConfigError(
                f"{s.key}.yaml: number", s.number, f"a number no other situation has ({seen[s.number]}.yaml has it)"
            )
        seen[s.number] = s.key
    return tuple(sorted(sits, key=_order))


@cache
def situations() -> tuple[Situation, ...]:
    """The built-in situations (``scenarios/guide/``), read once per process."""
    return load_situations()


def by_key() -> dict[str, Situation]:
    return {s.key: s for s in situations()}
