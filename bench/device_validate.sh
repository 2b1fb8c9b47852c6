#!/usr/bin/env bash
# kvsim validate on a CUDA GPU, as one prepared script (docs/validation.md, "On a GPU").
#
# Here, once (downloads, for the GPU machine's Python 3.12, the wheels its image lacks into .whl/):
#   bash bench/device_validate.sh fetch
# On the GPU machine, from the repository root (the lent-machine tool: carry [".whl"]):
#   bash bench/device_validate.sh            # full: 3 loads x paged/static (estimated 4-5 min on an H200)
#   bash bench/device_validate.sh quick      # the spec's quick subset
# A dry run of the same steps on this CPU:
#   DEVICE=cpu SPEC=scenarios/validate-cpu.yaml PYTHON=.venv/bin/python bash bench/device_validate.sh quick
# PROFILE=P reuses a profile instead of calibrating; VALIDATE_ARGS adds options (e.g. --no-engine-overhead).
# Results go to $OUT (or runs/device): validation.json, validate.log, gpu.txt, the two profiles and
# validation.html -- at most 8 files, the limit of what a lent machine returns.
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${SPEC:-scenarios/validate-cuda.yaml}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
WHEELS=(simpy==4.1.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        plotly==7.1.0)

if [ "${1:-}" = fetch ]; then
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
  ls -1 .whl
  exit 0
fi

OUT=${OUT:-runs/device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
if ! "$PY" -c "import simpy, pydantic" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
# a compiled hot path built on another machine is for another Python: run the sources
export PYTHONUNBUFFERED=1 KVSIM_NATIVE=0
"$PY" - "$DEVICE" <<'PYCHECK'
import importlib.util, sys
need = ("simpy", "pydantic", "numpy", "scipy", "pyarrow", "yaml", "typer", "rich", "torch")
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} "
             "(run 'bash bench/device_validate.sh fetch' on a machine with the package index, and carry .whl)")
import torch
if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
print("torch", torch.__version__, "on", torch.cuda.get_device_name(0) if sys.argv[1] == "cuda" else "cpu")
PYCHECK
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
args=(--device "$DEVICE" --scenario "$SPEC" --out "$WORK")
if [ "${1:-}" = quick ]; then args+=(--quick); fi
if [ -n "${PROFILE:-}" ]; then args+=(--profile "$PROFILE"); fi
# shellcheck disable=SC2206
args+=(${VALIDATE_ARGS:-})
set +e
timeout "${LIMIT_S:-560}" "$PY" -m sim.cli validate "${args[@]}" 2>&1 | tee "$OUT/validate.log"
rc=${PIPESTATUS[0]}
set -e
for f in validation.json validation.html profile-paged.json profile-static.json; do
  if [ -f "$WORK/$f" ]; then cp "$WORK/$f" "$OUT/"; fi
done
exit "$rc"
