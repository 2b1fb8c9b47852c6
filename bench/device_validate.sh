#!/usr/bin/env bash
# The GPU check as one prepared script (docs/validation.md, "On a GPU"; docs/calibration.md, "Attention
# kernel backends"), within 10 minutes on one GPU, the most telling step first:
#   1. kvsim validate with VALIDATE_KERNELS (default sdpa: flex, what `auto` picks on CUDA without
#      FlashInfer or vLLM, spends minutes compiling; on an H200 its calibrate --quick alone did not finish
#      in 100 s, while sdpa's timed 187 points in 17 s);
#   2. kvsim calibrate --quick with each of KERNELS (summary: paged overhead by block size);
#   3. paged vs contiguous decode attention by block size and batch, the backends side by side
#      (python -m bench.attention_backends), with the time left;
#   4. (only when STEPS names `profile`) where the reference engine's iteration time goes: its execute()
#      against the plain causal forward on the same tokens and against the validation's profiles' kernel
#      price, and the torch profiler's top operators (python -m bench.engine_profile; engine_profile.json).
# Each step has its own time limit; a backend that is missing or fails is reported and the rest go on.
#
# Here, once (downloads, for the GPU machine's Python 3.12, the wheels its image lacks into .whl/):
#   bash bench/device_validate.sh fetch          # EXTRA_WHEELS="pkg==v ..." adds more (e.g. flashinfer-python)
# On the GPU machine, from the repository root (the lent-machine tool: carry [".whl"]):
#   bash bench/device_validate.sh                # full validation spec
#   bash bench/device_validate.sh quick          # the spec's quick subset (needs more than 150 s on an H200)
# A dry run of the same steps on this CPU:
#   DEVICE=cpu SPEC=scenarios/validate-cpu.yaml PYTHON=.venv/bin/python bash bench/device_validate.sh quick
# PROFILE=P reuses a profile instead of calibrating in the validation; VALIDATE_ARGS adds options
# (e.g. --no-engine-overhead); KERNELS lists the backends of steps 2-3 (default: all); STEPS picks steps
# (default "validate calibrate attention"; "validate profile" for the engine's own profile); MODEL the calibrated model (default the spec's shape).
# Results go to $OUT (or runs/device), at most 8 files (what a lent machine returns): gpu.txt, run.log,
# attention.json, calibrations.json, validation.json, validation.html, profile-paged.json, profile-static.json
# (measured.json, the engine's side, when the validation stopped before writing validation.json;
# engine_profile.json with the profile step, in place of one of steps 2-3's files).
set -euo pipefail
cd "$(dirname "$0")/.."
SPEC=${SPEC:-scenarios/validate-cuda.yaml}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python3}
KERNELS=${KERNELS:-"flashinfer vllm flex sdpa"}
STEPS=${STEPS:-"validate calibrate attention"}
if [ "$DEVICE" = cuda ]; then VALIDATE_KERNELS=${VALIDATE_KERNELS:-sdpa}; else VALIDATE_KERNELS=${VALIDATE_KERNELS:-auto}; fi
VALIDATE_LIMIT_S=${VALIDATE_LIMIT_S:-330}
TOTAL_S=${TOTAL_S:-570}
ATTN_LIMIT_S=${ATTN_LIMIT_S:-150}
CAL_LIMIT_S=${CAL_LIMIT_S:-75}
PROFILE_LIMIT_S=${PROFILE_LIMIT_S:-120}
WHEELS=(simpy==4.1.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        plotly==7.1.0)

if [ "${1:-}" = fetch ]; then
  mkdir -p .whl
  # shellcheck disable=SC2206
  extra=(${EXTRA_WHEELS:-})
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}" "${extra[@]}"
  ls -1s .whl
  exit 0
fi

START=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
# a step's limit: its own ($1) or what is left of TOTAL_S less 10 s, the smaller
cap() { local l; l=$(( $(left) - 10 )); echo $(( l < $1 ? l : $1 )); }
OUT=${OUT:-runs/device}
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
export PYTHONPATH=$PWD
if ! "$PY" -c "import simpy, pydantic" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
# a compiled hot path built on another machine is for another Python: run the sources
export PYTHONUNBUFFERED=1 KVSIM_NATIVE=0
"$PY" - "$DEVICE" <<'PYCHECK' 2>&1 | tee -a "$LOG"
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
from calibration.attention_backends import availability
for name, why in availability(sys.argv[1]).items():
    print(f"attention backend {name}: {'available' if why is None else why}")
PYCHECK
[ "${PIPESTATUS[0]}" = 0 ] || exit 1
if [ "$DEVICE" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
fi
MODEL=${MODEL:-$("$PY" -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get('model', 'tiny-llama'))" "$SPEC")}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
available=$("$PY" -c "
import sys
from calibration.attention_backends import availability
ok = availability(sys.argv[1])
print(' '.join(k for k in sys.argv[2].split() if ok.get(k, 'unknown') is None))" "$DEVICE" "$KERNELS")
echo "backends to time: ${available:-none} (asked: $KERNELS)" | tee -a "$LOG"
rc=0

if [[ " $STEPS " == *" validate "* ]]; then
  limit=$(cap "$VALIDATE_LIMIT_S")
  echo "== 1. kvsim validate --kernels $VALIDATE_KERNELS (limit ${limit} s)" | tee -a "$LOG"
  args=(--device "$DEVICE" --scenario "$SPEC" --out "$WORK/validate" --kernels "$VALIDATE_KERNELS")
  if [ "${1:-}" = quick ]; then args+=(--quick); fi
  if [ -n "${PROFILE:-}" ]; then args+=(--profile "$PROFILE"); fi
  # shellcheck disable=SC2206
  args+=(${VALIDATE_ARGS:-})
  set +e
  timeout "${LIMIT_S:-$limit}" "$PY" -m sim.cli validate "${args[@]}" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  set -e
  for f in validation.json validation.html profile-paged.json profile-static.json; do
    if [ -f "$WORK/validate/$f" ]; then cp "$WORK/validate/$f" "$OUT/"; fi
  done
  # stopped before its report: the engine's side, written after the replays (no more than 8 files back)
  if [ ! -f "$WORK/validate/validation.json" ] && [ -f "$WORK/validate/measured.json" ]; then
    cp "$WORK/validate/measured.json" "$OUT/"
  fi
fi
if [[ " $STEPS " == *" calibrate "* ]]; then
  for k in $available; do
    [ "$(left)" -gt $(( CAL_LIMIT_S + 10 )) ] || { echo "calibrate $k: skipped, too little time left" | tee -a "$LOG"; continue; }
    echo "== 2. kvsim calibrate --kernels $k --quick ($MODEL, limit ${CAL_LIMIT_S} s)" | tee -a "$LOG"
    set +e
    timeout "$CAL_LIMIT_S" "$PY" -m sim.cli calibrate --device "$DEVICE" --kernels "$k" --quick --model "$MODEL" \
      --no-report --out "$WORK/cal-$k.json" 2>&1 | grep -v "━" | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || echo "calibrate $k: exit ${PIPESTATUS[0]} (124: hit its time limit)" | tee -a "$LOG"
    set -e
  done
  "$PY" - "$WORK" "$OUT/calibrations.json" <<'PYSUM' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
rows = {}
for f in sorted(Path(sys.argv[1]).glob("cal-*.json")):
    p = json.loads(f.read_text())
    lay, prov = p["layout"], p["provenance"]
    rows[f.stem[4:]] = {"attention_backend": prov.get("attention_backend"), "layout": lay,
                        "fit_quality": {k: v["overall"] for k, v in p["fit_quality"].items() if isinstance(v, dict)},
                        "elapsed_s": prov.get("elapsed_s"), "device_info": prov.get("device_info")}
    by = lay.get("paged_overhead_by_block_size", {})
    print(f"{f.stem[4:]:>10}: paged/contiguous - 1 = {lay.get('paged_overhead')} (block 16, median over the grid); "
          f"by block size {by}; skipped {lay.get('skipped_block_sizes', {})}; {prov.get('elapsed_s')} s")
Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
PYSUM
fi

if [[ " $STEPS " == *" attention "* && -n "$available" ]]; then
  ATTN_LIMIT_S=$(cap "$ATTN_LIMIT_S")
  if [ "$ATTN_LIMIT_S" -lt 30 ]; then
    echo "attention step: skipped, too little time left" | tee -a "$LOG"
  else
    echo "== 3. paged vs contiguous decode attention ($MODEL, limit ${ATTN_LIMIT_S} s)" | tee -a "$LOG"
    q=(); if [ "${1:-}" = quick ]; then q=(--quick); fi
    set +e
    timeout "$ATTN_LIMIT_S" "$PY" -m bench.attention_backends --device "$DEVICE" --model "$MODEL" "${q[@]}" \
      --backends "${available// /,}" --budget-s $(( ATTN_LIMIT_S * 2 / 3 )) --out "$OUT/attention.json" 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || echo "attention step: exit ${PIPESTATUS[0]} (124: hit its time limit)" | tee -a "$LOG"
    set -e
  fi
fi

if [[ " $STEPS " == *" profile "* ]]; then
  plimit=$(cap "$PROFILE_LIMIT_S")
  if [ "$plimit" -lt 30 ]; then
    echo "profile step: skipped, too little time left" | tee -a "$LOG"
  else
    echo "== 4. reference engine profile ($MODEL, $VALIDATE_KERNELS, limit ${plimit} s)" | tee -a "$LOG"
    # priced by the validation's own profiles when it wrote them: is the engine slower or faster than its kernels?
    priced=()
    if [ -f "$WORK/validate/profile-paged.json" ]; then
      priced=(--profile "$WORK/validate/profile-paged.json")
      if [ -f "$WORK/validate/profile-static.json" ]; then priced+=(--static-profile "$WORK/validate/profile-static.json"); fi
    fi
    set +e
    timeout "$plimit" "$PY" -m bench.engine_profile --device "$DEVICE" --model "$MODEL" --kernels "$VALIDATE_KERNELS" \
      "${priced[@]}" --out "$OUT/engine_profile.json" 2>&1 | grep -v "USDT:" | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || echo "profile step: exit ${PIPESTATUS[0]} (124: hit its time limit)" | tee -a "$LOG"
    set -e
  fi
fi

echo "done in $(( $(date +%s) - START )) s" | tee -a "$LOG"
exit "$rc"
