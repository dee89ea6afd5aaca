"""Native replays of cupy engines (engine.replay), run the way the TRTEngineOp kernel runs them: the CUDA driver
calls it names, through ctypes, from a thread that never used cupy, and the answers compared with the context's
own on fresh inputs."""
import ctypes
import logging
import threading

import numpy as np
import pytest

from tftrt_py.engine import Engine
from tftrt_py.engine.replay import ENABLED

from networks import conv_relu_pool_net
from gpu_helpers import GPU, assert_close, cupy_engine, healthy_gpu, single  # noqa: F401 (autouse fixture)

pytestmark = GPU

c_int, c_void_p, c_uint64, c_size_t = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t


def run_replay(replay, inputs, dtypes):
    """What kernel.cc's RunReplay does, on a fresh thread; the outputs as arrays."""
    f = replay.functions

    def fn(address, *argtypes):
        return ctypes.CFUNCTYPE(c_int, *argtypes)(address)

    set_context, to_device = fn(f.set_context, c_void_p), fn(f.to_device, c_uint64, c_void_p, c_size_t, c_void_p)
    to_host, launch = fn(f.to_host, c_void_p, c_uint64, c_size_t, c_void_p), fn(f.launch, c_void_p, c_void_p)
    synchronize = fn(f.synchronize, c_void_p)
    result = {}

    def run():
        codes = [set_context(replay.context)]
        for b, x in zip(replay.inputs, inputs):
            assert b.nbytes == x.nbytes
            ctypes.memmove(b.pinned, x.ctypes.data, b.nbytes)
            codes.append(to_device(b.device, b.pinned, b.nbytes, replay.stream))
        codes.append(launch(replay.graph, replay.stream))
        codes += [to_host(b.pinned, b.device, b.nbytes, replay.stream) for b in replay.outputs]
        codes.append(synchronize(replay.stream))
        result["codes"] = codes
        result["outs"] = [np.frombuffer((ctypes.c_char * b.nbytes).from_address(b.pinned), dt).reshape(b.shape).copy()
                          for b, dt in zip(replay.outputs, dtypes)]
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert result["codes"] == [0] * len(result["codes"])
    return result["outs"]


@pytest.mark.parametrize("precision, batch", [("FP32", 4), ("FP16", 4), ("FP16", 2)])
def test_a_replay_gives_the_contexts_answers_on_fresh_inputs(precision, batch):
    engine = cupy_engine(conv_relu_pool_net(4), precision)
    reference = Engine(conv_relu_pool_net(4), backend="numpy").create_execution_context()
    rng = np.random.default_rng(3)
    first = rng.standard_normal((batch, 8, 8, 3)).astype(np.float32)
    replay = engine.create_execution_context().native_replay([first], [np.dtype(np.float32)])
    assert replay is not None and replay.state[ENABLED] == 1
    assert [b.shape for b in replay.outputs] == [(batch, 5)]  # a smaller batch moves only its rows
    for run in range(3):
        x = rng.standard_normal((batch, 8, 8, 3)).astype(np.float32)
        (got,) = run_replay(replay, [x], [np.float32])
        want = reference.execute({"TensorRTInputPH_0": np.concatenate([x, x[:4 - batch]])})
        assert_close(got, want["TensorRTOutputPH_0"][:batch], precision, f"run {run}")


def test_no_replay_for_engines_with_host_synchronizing_steps_or_other_output_dtypes():
    topk = cupy_engine(single("TopK", [("float32", (3, 20))], {"axis": -1, "k": 5})())
    x = np.random.default_rng(0).standard_normal((3, 20)).astype(np.float32)
    assert topk.create_execution_context().native_replay([x], [np.dtype(np.float32), np.dtype(np.int32)]) is None
    conv = cupy_engine(conv_relu_pool_net(4), "FP16")
    images = np.random.default_rng(1).standard_normal((4, 8, 8, 3)).astype(np.float32)
    assert conv.create_execution_context().native_replay([images], [np.dtype(np.float16)]) is None


@pytest.mark.parametrize("failures", [1, 3])
def test_an_invalidated_capture_is_tried_again_before_running_eagerly(monkeypatch, caplog, failures):
    from tftrt_py.engine.backends.cupy import runner

    caplog.set_level(logging.INFO, logger=runner.__name__)
    real, left = runner.Runner._capture, [failures]

    def flaky(self):
        if left[0]:
            left[0] -= 1
            raise RuntimeError("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (simulated)")
        return real(self)
    monkeypatch.setattr(runner.Runner, "_capture", flaky)
    engine = cupy_engine(conv_relu_pool_net(4), "FP16")
    reference = Engine(conv_relu_pool_net(4), backend="numpy").create_execution_context()
    context = engine.create_execution_context()
    x = np.random.default_rng(5).standard_normal((4, 8, 8, 3)).astype(np.float32)
    replay = context.native_replay([x], [np.dtype(np.float32)])
    assert "attempt 1" in caplog.text
    if failures < runner.CAPTURE_ATTEMPTS:
        (got,) = run_replay(replay, [x], [np.float32])
    else:  # eager from then on: no replay, the context still answers
        assert replay is None and "runs it eagerly" in caplog.text
        got = context.execute({"TensorRTInputPH_0": x})["TensorRTOutputPH_0"]
    assert_close(got, reference.execute({"TensorRTInputPH_0": x})["TensorRTOutputPH_0"], "FP16")
