"""Two profiles' GEMM prices for one model side by side (``kvsim profile diff``).

The check a calibration on a new GPU invites: do the GEMMs ``kvsim calibrate --device cuda`` timed
there cost what the built-in profile for that GPU says? GEMMs are the comparable part: both sides
time the same matrix products (cuBLAS through torch; the built-ins' tables through TensorRT-LLM and
SGLang), whereas a device profile's attention is the reference engine's (a gather + SDPA, several
times a serving kernel's cost) and its engine terms are the reference engine's Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from sim.catalog import ModelSpec, get_gpu
from sim.cost.profile_model import ProfileCostModel, build_profile_cost_model
from sim.engine.deployment import BUILTIN_PROFILE_FOR_GPU
from sim.errors import ConfigError

#: Rows of the GEMMs compared (tokens in one iteration).
TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")


@dataclass(frozen=True)
class GemmRow:
    """One projection at one token count: seconds under profile A and profile B, and whether the
    token count lies outside either profile's measured grid (a priced, not a timed, point)."""

    proj: str
    tokens: int
    a_s: float
    b_s: float
    outside: bool

    @property
    def ratio(self) -> float:
        return self.a_s / self.b_s


def _gpu_for(profile: str) -> str:
    for gpu, name in BUILTIN_PROFILE_FOR_GPU.items():
        if name == profile:
            return gpu
    return "H100-SXM-80GB"  # any: a GEMM curve does not read the GPU spec


#: ``kvsim profile diff``'s model when neither profile was calibrated for exactly one.
DEFAULT_MODEL = "llama-3.1-8b"


def default_model(a: str, b: str) -> str:
    """The model ``kvsim profile diff`` prices without ``--model``: the one model profile A (else B)
    was calibrated for, when it holds exactly one (a device calibration holds the model it timed:
    ``kvsim calibrate --device cpu --model tiny-llama`` prices tiny-llama only); else
    :data:`DEFAULT_MODEL`. A profile that does not load is left for :func:`gemm_rows` to name."""
    from calibration.cli import model_option
    from sim.cost.profile import load_profile

    for ref in (a, b):
        try:
            names = {key.rsplit("@", 1)[0] for key in load_profile(ref).models}
            if len(names) == 1:
                name = names.pop()
                model_option(name)  # a name kvsim resolves (not a config file's path elsewhere)
                return name
        except ConfigError:
            continue
    return DEFAULT_MODEL


def gemm_rows(
    a: str,
    b: str,
    model: str | ModelSpec,
    *,
    tensor_parallel: int = 1,
    weight_dtype: str = "bf16",
    tokens: tuple[int, ...] = TOKENS,
) -> list[GemmRow]:
    """Per projection of ``model`` (TP ``tensor_parallel``) and token count: the GEMM's seconds under
    profiles ``a`` and ``b`` (built-in names or JSON paths). ``model``: a shape, or what ``kvsim run
    --model`` takes (:func:`calibration.cli.model_option`). A ConfigError names a profile that does
    not price this model."""
    if tensor_parallel not in (1, 2, 4, 8):
        raise ConfigError("--tp", tensor_parallel, "1, 2, 4 or 8")  # before either profile is blamed for it
    if isinstance(model, ModelSpec):
        spec = model
    else:
        from calibration.cli import model_option

        spec = model_option(model)
    models = []
    for key, ref in (("a", a), ("b", b)):
        try:
            cm = build_profile_cost_model(
                ref, spec, get_gpu(_gpu_for(ref)), tensor_parallel=tensor_parallel, weight_dtype=weight_dtype
            )
        except ConfigError as exc:  # named as the command's argument, not the scenario key
            raise ConfigError(f"profile {key.upper()}", exc.value, exc.allowed) from None
        if not isinstance(cm, ProfileCostModel):
            raise ConfigError(f"profile {key.upper()}", ref, "a calibrated profile (got the roofline prior)")
        models.append(cm)
    rows = []
    for proj in PROJECTIONS:
        for n in tokens:
            (ta, oa), (tb, ob) = models[0].gemm_s(proj, n), models[1].gemm_s(proj, n)
            rows.append(GemmRow(proj, n, ta, tb, oa or ob))
    return rows


def summary(rows: list[GemmRow]) -> dict:
    """Median and largest |A/B − 1| over the rows both profiles measured (``n``), and over all."""
    inside = [abs(r.ratio - 1) for r in rows if not r.outside]
    every = [abs(r.ratio - 1) for r in rows]
    return {
        "n_measured": len(inside),
        "median_abs_diff_measured": median(inside) if inside else None,
        "max_abs_diff_measured": max(inside) if inside else None,
        "n": len(every),
        "median_abs_diff": median(every),
    }
