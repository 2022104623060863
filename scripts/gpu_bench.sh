#!/usr/bin/env bash
# The GPU measurements: scripts/gpu_bench.sh [--cpu-smoke] [--out DIR] [PART ...] [key=value ...]
# (make gpu-bench ARGS="..."); key=value arguments go to every part's trainer config (benchmarks/gpu_bench.py).
#
# Runs each PART (default: all, in PARTS' order) as its own process (benchmarks/gpu_bench.py PART), each cut
# off after GPU_BENCH_PART_TIMEOUT seconds (470: every part is sized for under 8 minutes on one H100). Each
# writes DIR/PART.json (default DIR: benchmarks/results, with --cpu-smoke benchmarks/results/cpu-smoke) and
# prints its table; all output also goes to DIR/gpu_bench.log. A part that fails says why in one line and the
# others still run; the exit status is the number of parts that failed.
#
# On a GPU host without the data stack (grain, ...) and without a package index: make the wheels where pip
# reaches the index, `scripts/gpu_bench_wheels.sh .whl` (.whl/ is git-ignored), take .whl along to the GPU host,
# and where an import fails this script installs them (--no-index) into GPU_BENCH_SITE before the first part.
# Every import working: it goes on without them.
set -uo pipefail

PARTS=(throughput-8b throughput-1b attention quantize restart)
smoke=() out="" parts=() overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) smoke=(--cpu-smoke) ;;
    --out) out="${2:-}"; shift ;;
    --out=*) out="${1#--out=}" ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *=*) overrides+=("$1") ;;
    *) parts+=("$1") ;;
  esac
  shift
done
[ ${#parts[@]} -gt 0 ] || parts=("${PARTS[@]}")
case "$out" in /*) ;; ?*) out="$PWD/$out" ;; esac  # a relative --out: from where the script was started
cd "$(dirname "$0")/.." || exit ${#parts[@]}
[ -n "$out" ] || out="benchmarks/results${smoke:+/cpu-smoke}"
mkdir -p "$out" || { echo "gpu-bench: can't create $out"; exit ${#parts[@]}; }
log="$out/gpu_bench.log"
: >"$log"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi

# What the trainer imports; the GPU host's image lacks the data stack (grain, ...), which the wheels bring.
needs() { "$py" -c "import jax, flax, optax, orbax.checkpoint, yaml, grain, MaxText.data" 2>&1; }
wheels="${GPU_BENCH_WHEELS:-.whl}"
if ! needs >/dev/null && compgen -G "$wheels/*.whl" >/dev/null; then
  site="${GPU_BENCH_SITE:-/tmp/gpu-bench-site}"
  if ! "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
      "$wheels"/*.whl >>"$log" 2>&1; then
    echo "gpu-bench: installing the wheels in $wheels failed (see $log); every part skipped" | tee -a "$log"
    exit ${#parts[@]}
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! missing=$(needs); then
  echo "gpu-bench: $py can't import what the trainer needs ($(tail -n1 <<<"$missing")); make the wheels with" \
    "scripts/gpu_bench_wheels.sh $wheels where pip reaches an index and bring $wheels along; every part skipped" | tee -a "$log"
  exit ${#parts[@]}
fi

timeout_s="${GPU_BENCH_PART_TIMEOUT:-470}"
failed=0 summary=()
for part in "${parts[@]}"; do
  echo "=== gpu-bench $part" | tee -a "$log"
  start=$SECONDS
  PYTHONUNBUFFERED=1 timeout --kill-after=20 "$timeout_s" "$py" benchmarks/gpu_bench.py "$part" "${smoke[@]}" \
    --out "$out" "${overrides[@]}" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  took=$((SECONDS - start))
  if [ "$rc" -eq 0 ]; then
    summary+=("$part: ok (${took} s)")
    continue
  fi
  failed=$((failed + 1))
  case "$rc" in
    124|137) why="timed out after ${timeout_s} s" ;;
    *) why=$(grep -h "^gpu-bench: $part failed: " "$log" | tail -n1 | sed "s/^gpu-bench: $part failed: //")
       why="${why:-exit code $rc: $(grep -v '^\s*$' "$log" | tail -n1 | cut -c1-200)}" ;;
  esac
  summary+=("$part: FAILED ($why)")
done
{
  echo "=== gpu-bench: ${#parts[@]} part(s), $failed failed; JSON in $out"
  printf '  %s\n' "${summary[@]}"
} | tee -a "$log"
# Each measurement beside the estimate written for this GPU before it ran (benchmarks/results/gpu_bench_predictions/,
# benchmarks/roofline_calibration.py --predict-gpu-bench GPU); a GPU without predictions is said so.
if [ ${#smoke[@]} -eq 0 ]; then
  echo "=== gpu-bench: measured vs predicted" | tee -a "$log"
  "$py" benchmarks/roofline_calibration.py --score "$out" benchmarks/results/gpu_bench_predictions 2>&1 | tee -a "$log"
fi
exit "$failed"
