#!/usr/bin/env bash
# One call on the GPU machine: the carried cuDNN frontend wheel installed, the GPU tests, then
# benchmarks/gpu_vs_torch.py with the given arguments; logs and the JSON results land in $OUT.
#
#   bash benchmarks/gpu_session.sh [--no-tests] [--] [gpu_vs_torch.py arguments]
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # installed once; a later call on the same machine finds /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
tests=1
if [ "${1:-}" = "--no-tests" ]; then tests=0; shift; fi
[ "${1:-}" = "--" ] && shift
status=0
if [ "$tests" = 1 ]; then
  timeout "${TEST_LIMIT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=5 tests/engine/gpu 2>&1 \
    | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|error|FAILED|ERROR|Error|s call" | tail -40
  status=$?
fi
if [ $# -gt 0 ]; then
  python3 benchmarks/gpu_vs_torch.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -80
fi
exit $status
