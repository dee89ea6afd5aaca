#!/usr/bin/env bash
# One call on the GPU machine: the carried cuDNN frontend wheel installed, the GPU tests, then
# benchmarks/gpu_vs_torch.py with the given arguments; logs and the JSON results land in $OUT.
#
#   bash benchmarks/gpu_session.sh [--no-tests] [--] [gpu_vs_torch.py arguments]
#
# TensorFlow (its CPU wheel is too big for one call's transfer) arrives in pieces: earlier calls on the
# same warm machine copy the parts of the split wheel into /tmp/tfparts (`cp .tfcN/tfpart.* /tmp/tfparts/`);
# this script then joins and installs them with the small wheels beside the last part (.tfc6/*.whl) into
# /tmp/tfsite. With TensorFlow there, the engine-op GPU tests run too, and SERVED="<served_gpu.py args>"
# runs benchmarks/served_gpu.py (the converted SavedModels as users serve them).
# The wheels install with their bytecode, as pip installs them for users (the GPU machine's environment sets
# PYTHONDONTWRITEBYTECODE, so modules installed without it are compiled again by every process).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # installed once; a later call on the same machine finds /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
if [ -d /tmp/tfparts ] && [ ! -d /tmp/tfsite ]; then
  mkdir -p /tmp/tfwheels && cat /tmp/tfparts/tfpart.* > /tmp/tfwheels/tensorflow_cpu-2.21.0-cp312-cp312-manylinux_2_27_x86_64.whl
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/tfsite \
    /tmp/tfwheels/*.whl .tfc6/*.whl || rm -rf /tmp/tfsite
fi
[ -d /tmp/tfsite ] && export PYTHONPATH="$PYTHONPATH:/tmp/tfsite"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
tests=1
if [ "${1:-}" = "--no-tests" ]; then tests=0; shift; fi
[ "${1:-}" = "--" ] && shift
status=0
if [ "$tests" = 1 ]; then
  targets="tests/engine/gpu"
  [ -d /tmp/tfsite ] && targets="$targets tests/engine_op/test_gpu_engine_op.py"
  timeout "${TEST_LIMIT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=5 $targets 2>&1 \
    | tee "$OUT/gpu_tests.log" | grep -E "passed|failed|error|FAILED|ERROR|Error|s call" | tail -40
  status=$?
fi
if [ -n "${SERVED:-}" ] && [ -d /tmp/tfsite ]; then
  python3 benchmarks/served_gpu.py --json "$OUT/served.json" $SERVED 2>&1 | tee "$OUT/served.log" \
    | grep -v "^\s*$" | grep -v "^[WI]0000\|cpu_feature_guard\|rebuild TensorFlow" | tail -60
fi
if [ $# -gt 0 ]; then
  python3 benchmarks/gpu_vs_torch.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | grep -v "^\s*$" | tail -80
fi
exit $status
