#!/usr/bin/env bash
# GPU checks of the CUDA implementation, in one script (about 8 minutes on a GPU).
#
#   tests/gpu/run.sh             on a CUDA machine: every step on the real driver (target `cuda`)
#   tests/gpu/run.sh --dry-run   the same steps on the host driver emulator (target `cuda-host`), no GPU needed
#   tests/gpu/run.sh --plan      print the steps and exit
#
# Steps: driver info and granularity; `memspec conform` (all levels); a
# differential replay of one long trace on emulator and driver; the
# stream-gate fence test; a leak check (cuMemGetInfo back to baseline); a
# latency table (commit/decommit of 1, 8, 64 pages vs the raw driver calls);
# the pytest GPU tests.  Output and reports go to $OUT (default memspec-out/gpu-run/).
# Exit status: 0 when every step passed, 1 otherwise.
set -u
cd "$(dirname "$0")/../.."

DRY=0
PLAN=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --plan) PLAN=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown argument: $a" >&2; exit 2 ;;
  esac
done

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=python3; fi
TARGET=cuda
[ "$DRY" = 1 ] && TARGET=cuda-host
OUT="${OUT:-memspec-out/gpu-run}"
EXAMPLES="${CONFORM_EXAMPLES:-30}"
STEPS="${CONFORM_STEPS:-40}"
CAPACITY="${CONFORM_CAPACITY:-1073741824}"   # bytes the target may take (OOM beyond): 1 GiB
TOOL=tests/gpu/gpu_tool.py

NAMES=(info conform differential gate leak latency pytest)
CMDS=(
  "$PY $TOOL info --target $TARGET"
  "$PY -m memspec conform $TARGET --level all --capacity $CAPACITY --examples $EXAMPLES --steps $STEPS --json $OUT/conform.json --junit $OUT/conform.xml --out $OUT/repro --db $OUT/db --quiet"
  "$PY $TOOL differential --target $TARGET --length 2000"
  "$PY $TOOL gate --target $TARGET"
  "$PY $TOOL leak --target $TARGET"
  "$PY $TOOL latency --target $TARGET --reps 20"
  "$PY -m pytest tests/gpu -q -rs -p no:cacheprovider"
)
LIMITS=(60 300 120 60 120 120 240)

echo "memspec GPU run: target $TARGET ($([ "$DRY" = 1 ] && echo 'dry run on the host emulator' || echo 'real CUDA driver')), output in $OUT/"
if [ "$PLAN" = 1 ]; then
  for i in "${!NAMES[@]}"; do printf '  %-13s (<= %3ss) %s\n' "${NAMES[$i]}" "${LIMITS[$i]}" "${CMDS[$i]}"; done
  exit 0
fi

mkdir -p "$OUT"
STATUS=()
SECS=()
FAILED=0
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}
  echo
  echo "== ${name}: ${CMDS[$i]}"
  t0=$(date +%s)
  if [ "$DRY" = 1 ]; then
    MEMSPEC_CUDA_DRIVER=host timeout "${LIMITS[$i]}" ${CMDS[$i]} 2>&1 | tee "$OUT/$name.log"
  else
    timeout "${LIMITS[$i]}" ${CMDS[$i]} 2>&1 | tee "$OUT/$name.log"
  fi
  rc=${PIPESTATUS[0]}
  t1=$(date +%s)
  SECS+=($((t1 - t0)))
  if [ "$rc" = 0 ]; then STATUS+=(PASS)
  elif [ "$rc" = 124 ]; then STATUS+=(TIMEOUT); FAILED=1
  else STATUS+=("FAIL($rc)"); FAILED=1; fi
done

echo
echo "== summary (target $TARGET)"
for i in "${!NAMES[@]}"; do printf '  %-13s %-10s %4ss\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}"; done
exit $FAILED
