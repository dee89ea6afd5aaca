"""Whole engines on the cupy backend: ResNet-50 in FP32/FP16 against the numpy backend, plans,
tactics, device checks, concurrency, device arrays, memory accounting and errors."""
import logging

import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Engine, Profiler, RuntimeExecutionError, Runtime
from tftrt_py.engine.backends.cupy import _device

import gpu_resnet50 as resnet50
from networks import conv_relu_pool_net
from threads import run_threads
from gpu_helpers import GPU, assert_close, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU

BATCH, SIZE = 2, 64


@pytest.fixture(scope="module")
def model():
    return resnet50.spec(classes=100)


@pytest.fixture(scope="module")
def reference(model):
    return Engine(resnet50.network(BATCH, SIZE, model), backend="numpy").create_execution_context()


def build(model, precision, batch=BATCH):
    config = BuilderConfig(precision=precision, backend="cupy")
    return Builder(config).build_engine(resnet50.network(batch, SIZE, model))


def images(rng, batch=BATCH):
    return {"input": rng.standard_normal((batch, SIZE, SIZE, 3)).astype(np.float32)}


@pytest.fixture(scope="module")
def fp16_engine(model):
    return build(model, "FP16")


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_resnet50_matches_numpy(model, reference, precision, fp16_engine):
    engine = fp16_engine if precision == "FP16" else build(model, precision)
    assert engine.device != "cpu" and engine.tactics
    if _device.cudnn_module() is not None:  # else convolutions run as im2col + cuBLAS GEMMs
        convs = [t for name, t in engine.tactics.items() if "conv" in name and "cudnn" in str(t.get("op"))]
        assert convs, engine.tactics
    ctx = engine.create_execution_context()
    rng = np.random.default_rng(7)
    for run in range(3):  # eager + capture, then two graph replays on fresh inputs
        x = images(rng)
        got, ref = ctx.execute(x)["logits"], reference.execute(x)["logits"]
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        print(f"{precision} run {run}: relative L2 error {err:.2e}")
        assert_close(got, ref, precision, f"run {run}")


def test_plan_round_trip_reuses_tactics(fp16_engine, reference):
    plan = fp16_engine.serialize()
    engine = Runtime().deserialize_cuda_engine(plan)
    assert engine.tactics == fp16_engine.tactics and engine.device == fp16_engine.device
    x = images(np.random.default_rng(3))
    got = engine.create_execution_context().execute(x)["logits"]
    assert_close(got, reference.execute(x)["logits"], "FP16")
    kept = {k: v.get("plan") for k, v in engine.tactics.items()}
    assert kept == {k: v.get("plan") for k, v in fp16_engine.tactics.items()}


def test_plan_from_another_gpu_is_retuned(fp16_engine, reference, caplog):
    engine = Runtime().deserialize_cuda_engine(fp16_engine.serialize())
    engine.device = "Some Other GPU (sm_80)"
    with caplog.at_level(logging.WARNING):
        ctx = engine.create_execution_context()
    assert "re-tuning" in caplog.text and engine.device == fp16_engine.device
    x = images(np.random.default_rng(4))
    assert_close(ctx.execute(x)["logits"], reference.execute(x)["logits"], "FP16")


def test_contexts_run_concurrently_from_threads(fp16_engine, reference):
    def work(seed):
        ctx = fp16_engine.create_execution_context()
        rng = np.random.default_rng(seed)
        for _ in range(4):
            x = images(rng)
            assert_close(ctx.execute(x)["logits"], reference.execute(x)["logits"], "FP16")

    run_threads(work, range(4))


def test_smaller_batch_and_device_arrays(fp16_engine, reference):
    import cupy

    ctx = fp16_engine.create_execution_context()
    x = images(np.random.default_rng(5))
    one = {"input": x["input"][:1]}
    assert_close(ctx.execute(one)["logits"], reference.execute(x)["logits"][:1], "FP16")
    out = ctx.execute({"input": cupy.asarray(x["input"])})["logits"]
    assert isinstance(out, cupy.ndarray)
    assert_close(cupy.asnumpy(out), reference.execute(x)["logits"], "FP16")


def test_device_arrays_at_changing_batches_strides_and_bad_inputs(fp16_engine, reference):
    """Device inputs are checked whenever their shapes or dtypes change: a full batch, a smaller one, a
    strided view and a full batch again each compute their own rows, and a bad call is refused with a clear
    error and leaves the context serving."""
    import cupy

    ctx = fp16_engine.create_execution_context()
    x = images(np.random.default_rng(9))["input"]
    want = reference.execute({"input": x})["logits"]
    wide = cupy.asarray(np.concatenate([x, x], axis=1))  # rows 0..SIZE-1 of each image's columns: a view
    calls = [(cupy.asarray(x), want), (cupy.asarray(x[:1]), want[:1]),
             (wide[:, :SIZE], want), (cupy.asarray(x), want)]
    for src, expected in calls:
        got = ctx.execute({"input": src})["logits"]
        assert got.shape == expected.shape
        assert_close(cupy.asnumpy(got), expected, "FP16")
    bad = [({}, "missing input bindings ['input']"),
           ({"input": cupy.asarray(x.astype(np.float16))}, "input 'input' has dtype float16, the engine expects "
                                                           "float32"),
           ({"input": cupy.asarray(np.concatenate([x, x]))}, "cannot be served by this engine")]
    for bindings, message in bad:
        with pytest.raises(RuntimeExecutionError, match=message.replace("[", r"\[").replace("]", r"\]")):
            ctx.execute(bindings)
        assert_close(cupy.asnumpy(ctx.execute({"input": cupy.asarray(x)})["logits"]), want, "FP16")


def test_profiler_and_memory_report(fp16_engine):
    from tftrt_py.engine.backends import get_backend

    ctx = fp16_engine.create_execution_context()
    ctx.profiler = Profiler()
    ctx.execute(images(np.random.default_rng(6)))
    assert "conv1" in ctx.profiler.records and all(v[0] >= 0 for v in ctx.profiler.records.values())
    report = get_backend("cupy").memory_report(fp16_engine)
    assert report["weights"] > 0 and report["activations"] > 0 and report["workspace"] > 0 and report["io"] > 0
    # The plan stores the FP16 layers' weights as float16 (the Constant fc.weight stays float32); on the device
    # every weight is float16, bar float32 copies of biases an epilogue reads and the stem's 3 input channels
    # padded to 8: 2 bytes a weight, a few per cent more at most.
    layers = fp16_engine.network.layers
    assert {str(w.dtype) for l in layers if l.kind != "Constant" for w in l.weights.values()} == {"float16"}
    half = 2 * sum(w.size for l in layers for w in l.weights.values())
    assert half <= report["weights"] < 1.05 * half


def test_builder_path_and_fp32_strictness():
    net_ref, net = conv_relu_pool_net(), conv_relu_pool_net()
    engine = Builder(BuilderConfig(backend="cupy")).build_engine(net)
    assert engine.build_config["allow_tf32"] is False
    x = np.random.default_rng(8).standard_normal((4, 8, 8, 3)).astype(np.float32)
    ref = Engine(net_ref, backend="numpy").create_execution_context().execute_v2([x])[0]
    assert_close(engine.create_execution_context().execute_v2([x])[0], ref, "FP32")


def test_out_of_memory_is_a_clear_error():
    from tftrt_py.engine import Network

    net = Network("huge")
    x = net.add_input("x", "float32", (1 << 19, 1 << 17))  # 256 GiB in, 256 GiB out
    net.mark_output(net.add_layer("Unary", [x], {"op": "exp"}).outputs[0], name="y")
    engine = Engine(net, backend="cupy")
    import cupy

    with pytest.raises(RuntimeExecutionError, match="out of GPU memory"):
        engine.create_execution_context()
    cupy.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_bert_layer_matches_numpy(precision):
    """A small BERT encoder layer (the benchmark's, narrower) through the builder: attention, softmax,
    Reduce-based LayerNorm, FFN with GELU."""
    import gpu_bert as bert

    model = bert.spec(hidden=64, heads=4, ffn=256)

    def build():
        return bert.network(2, 32, model, dtype="float32")

    reference = Engine(build(), backend="numpy").create_execution_context()
    engine = Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(build())
    ctx = engine.create_execution_context()
    rng = np.random.default_rng(12)
    for run in range(2):
        x = {"x": rng.standard_normal((2, 32, 64)).astype(np.float32)}
        assert_close(ctx.execute(x)["y"], reference.execute(x)["y"], precision, f"run {run}")


@pytest.mark.parametrize("src, dst", [("float32", "float16"), ("float16", "float32")])
@pytest.mark.parametrize("size, offset", [(4096, 0), (4099, 0), (4099, 1)])  # whole groups of 4, a tail, misaligned
def test_casts_between_float32_and_float16_round_as_astype(src, dst, size, offset):
    from tftrt_py.engine.backends.cupy.ops.cast import CastOp

    cupy = _device.require()
    values = np.random.default_rng(size).standard_normal(size + offset) * 1e3
    values[offset:offset + 4] = [np.nan, np.inf, 7e4, -1e-8]  # NaN, infinities (fp16 overflows), underflow
    x = cupy.asarray(values.astype(src))[offset:]
    y = cupy.full(size + offset, 5, dst)[offset:]
    CastOp(src, dst).run(None, [x], [y])
    np.testing.assert_array_equal(y.get(), x.get().astype(dst))
