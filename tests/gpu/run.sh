#!/usr/bin/env bash
# GPU checks of the CUDA implementation and the adapters, in one script (about 12 minutes on a GPU).
#
#   tests/gpu/run.sh             on a CUDA machine: every step on the real driver (target `cuda`)
#   tests/gpu/run.sh --dry-run   the same steps on the host driver emulator (target `cuda-host`), no GPU needed
#   tests/gpu/run.sh --plan      print the steps and exit
#
# Steps: driver info and granularity; `memspec conform` (all levels); a
# differential replay of one long trace on emulator and driver; the
# stream-gate fence test; a leak check (cuMemGetInfo back to baseline); a
# latency table (commit/decommit of 1, 8, 64 pages vs the raw driver calls);
# the pytest GPU tests.  Then the adapters (issue 14): `memspec conform` at a
# small budget on cuda-core-vmm, cuda-core-mr, cupy-pool, torch-caching; the
# cuda.core VMM checks (leak against cuMemGetInfo, stream-ordered deallocate,
# growth); the PyTorch differential; the adapters' pytest GPU tests.
# GPU-only steps are skipped by --dry-run (listed as SKIP with the reason).
#
# Kinds: a "check" step passes on exit 0; a "report" step (conform of a real
# allocator, the differential) records findings: exit 0 or 1 is RAN (its
# output is the report), anything else (a crash, 124 timeout) fails.
# Output and reports go to $OUT (default memspec-out/gpu-run/).
# Exit status: 0 when every check passed and every report ran, 1 otherwise.
#
# No network, no z3/crosshair needed (the GPU image): when memspec is not
# importable, it is installed with `pip install --no-deps --no-build-isolation -e .`,
# or, failing that, made importable through a symlink tree on PYTHONPATH
# (tests/gpu/linktree.py: packages and entry points, no pip).
set -u
cd "$(dirname "$0")/../.."

DRY=0
PLAN=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    --plan) PLAN=1 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | grep '^#'; exit 0 ;;
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
AEX="${ADAPTER_EXAMPLES:-10}"                 # adapters: small budget
AST="${ADAPTER_STEPS:-20}"
ACONF="-m memspec conform --level all --capacity $CAPACITY --examples $AEX --steps $AST --out $OUT/repro --quiet"

# name | where (both: also in --dry-run; gpu: GPU only) | kind (check|report) | limit (s) | command
STEPS=(
  "info|both|check|60|$PY $TOOL info --target $TARGET"
  "conform|both|check|300|$PY -m memspec conform $TARGET --level all --capacity $CAPACITY --examples $EXAMPLES --steps $STEPS --json $OUT/conform.json --junit $OUT/conform.xml --out $OUT/repro --db $OUT/db --quiet"
  "differential|both|check|120|$PY $TOOL differential --target $TARGET --length 2000"
  "gate|both|check|60|$PY $TOOL gate --target $TARGET"
  "leak|both|check|120|$PY $TOOL leak --target $TARGET"
  "latency|both|check|120|$PY $TOOL latency --target $TARGET --reps 20"
  "pytest|both|check|240|$PY -m pytest tests/gpu -q -rs -p no:cacheprovider"
  "cuda-core-vmm|both|report|180|$PY $ACONF cuda-core-vmm --json $OUT/cuda-core-vmm.json"
  "cuda-core-leak|both|check|60|$PY -m memspec.adapters.cuda_core_checks leak"
  "cuda-core-stream|both|report|60|$PY -m memspec.adapters.cuda_core_checks stream"
  "cuda-core-grow|both|report|60|$PY -m memspec.adapters.cuda_core_checks grow"
  "cuda-core-mr|gpu|report|120|$PY $ACONF cuda-core-mr --json $OUT/cuda-core-mr.json"
  "cupy-pool|gpu|report|120|$PY $ACONF cupy-pool --json $OUT/cupy-pool.json"
  "torch-caching|gpu|report|180|$PY $ACONF torch-caching --json $OUT/torch-caching.json"
  "torch-diff|both|report|180|$PY -m memspec.adapters.torch_differential --length 400 --capacity 536870912 $([ "$DRY" = 1 ] && echo --dry-run)"
  "adapters-pytest|both|check|240|$PY -m pytest tests/test_adapters.py -q -rs -p no:cacheprovider -m gpu"
)
NAMES=(); WHERE=(); KINDS=(); LIMITS=(); CMDS=()
for st in "${STEPS[@]}"; do
  IFS='|' read -r n w k l c <<<"$st"
  NAMES+=("$n"); WHERE+=("$w"); KINDS+=("$k"); LIMITS+=("$l"); CMDS+=("$c")
done

echo "memspec GPU run: target $TARGET ($([ "$DRY" = 1 ] && echo 'dry run on the host emulator' || echo 'real CUDA driver')), output in $OUT/"
if [ "$PLAN" = 1 ]; then
  for i in "${!NAMES[@]}"; do
    printf '  %-16s %-4s %-6s (<= %3ss) %s\n' "${NAMES[$i]}" "${WHERE[$i]}" "${KINDS[$i]}" "${LIMITS[$i]}" "${CMDS[$i]}"
  done
  exit 0
fi

mkdir -p "$OUT"
# memspec importable? (the GPU image: no network, maybe no setuptools)
if ! $PY -c "import memspec.adapters" >/dev/null 2>&1; then
  echo "memspec is not importable by $PY: installing with --no-deps"
  if ! $PY -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    echo "pip install failed (see $OUT/install.log): using a symlink tree on PYTHONPATH"
    $PY tests/gpu/linktree.py "$OUT/site" >/dev/null || { echo "cannot make memspec importable" >&2; exit 1; }
    export PYTHONPATH="$PWD/$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
if [ "$DRY" = 1 ]; then export MEMSPEC_CUDA_DRIVER=host; else export MEMSPEC_CUDA_DRIVER=cuda; fi

STATUS=()
SECS=()
FAILED=0
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}
  echo
  if [ "$DRY" = 1 ] && [ "${WHERE[$i]}" = gpu ]; then
    echo "== ${name}: SKIP (GPU only: needs the real driver and the library)"
    STATUS+=("SKIP(gpu)"); SECS+=(0)
    continue
  fi
  echo "== ${name}: ${CMDS[$i]}"
  t0=$(date +%s)
  timeout "${LIMITS[$i]}" ${CMDS[$i]} 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  t1=$(date +%s)
  SECS+=($((t1 - t0)))
  if [ "$rc" = 124 ]; then STATUS+=(TIMEOUT); FAILED=1
  elif [ "${KINDS[$i]}" = report ] && { [ "$rc" = 0 ] || [ "$rc" = 1 ]; }; then STATUS+=("RAN($rc)")
  elif [ "$rc" = 0 ]; then STATUS+=(PASS)
  else STATUS+=("FAIL($rc)"); FAILED=1; fi
done

echo
echo "== summary (target $TARGET)"
for i in "${!NAMES[@]}"; do printf '  %-16s %-10s %4ss\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}"; done
exit $FAILED
