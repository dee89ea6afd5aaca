"""The cupy Attention candidates (two GEMMs around a masked softmax; the fp16 flash kernel; cuDNN's fused
attention, a mask as its bias) and the one-pass residual LayerNorm against the numpy backend: fresh random
inputs, NaN-poisoned buffers, masks broadcast every way with fully masked rows, causal with and without a mask,
CUDA-graph replays equal to the eager run, 20 runs bitwise identical."""
import numpy as np
import pytest

from gpu_helpers import GPU, assert_close, compare, cupy_engine
from networks import attention_block_net
from tftrt_py.engine import Network

pytestmark = GPU

BIG = -2.372671e38  # Keras's large negative for float32


def only(monkeypatch, op: str):
    """Build Attention layers with the one candidate `op`: "gemm", "flash4" / "flash8" (warps a block), or "cudnn"
    (cuDNN's plans; skips where the cuDNN frontend is missing)."""
    from tftrt_py.engine.backends.cupy import _device
    from tftrt_py.engine.backends.cupy.ops import attention
    from tftrt_py.engine.backends.cupy.ops.base import FACTORIES

    if op == "cudnn":
        if _device.cudnn_module() is None:
            pytest.skip("no cuDNN frontend")
        monkeypatch.setitem(FACTORIES, "Attention", attention._sdpa_candidates)
        return
    make = (lambda spec: attention.GemmAttentionOp(spec)) if op == "gemm" else (
        lambda spec: attention.FlashAttentionOp(spec, int(op[5:])))
    monkeypatch.setitem(FACTORIES, "Attention", lambda spec: [make(spec)])


def proposed(monkeypatch, build, precision="FP16"):
    """The tactic ops the Attention layer's candidates would run (all of them, before timing)."""
    from tftrt_py.engine.backends.cupy.ops import attention
    from tftrt_py.engine.backends.cupy.ops.base import FACTORIES

    seen = []

    def spy(spec):
        cands = attention.attention_candidates(spec)
        seen.extend(c.tactic["op"] for c in cands)
        return cands
    monkeypatch.setitem(FACTORIES, "Attention", spy)
    cupy_engine(build(), precision)
    return seen


def attention_net(b, sq, sk, heads, d, mask_shape=None, causal=False, mask_value=BIG, packed=True):
    def build():
        net = Network("attention")
        if packed and sq == sk:  # one fused QKV tensor read through column windows
            qkv = net.add_input("qkv", "float32", (b, sq, 3 * heads * d))
            inputs, w = [qkv] * 3, heads * d
            params = {"heads": heads, "columns": [[0, w], [w, w], [2 * w, w]]}
        elif packed:
            inputs = [net.add_input(n, "float32", (b, s, heads * d)) for n, s in zip("qkv", (sq, sk, sk))]
            params = {"heads": heads}
        else:
            inputs = [net.add_input(n, "float32", (b, heads, s, d)) for n, s in zip("qkv", (sq, sk, sk))]
            params = {"heads": None}
        if mask_shape:
            inputs.append(net.add_input("mask", "bool", mask_shape))
        if mask_shape or causal:
            params.update(causal=causal, mask_value=mask_value)
        params["scale"] = float(d) ** -0.5
        net.mark_output(net.add_layer("Attention", inputs, params, name="attention").outputs[0], name="y")
        return net
    return build


def attention_inputs(net_build, mask_shape, left_padding=False):
    """Random inputs; a random mask with one row masked entirely (a uniform softmax over every key), or with
    `left_padding` each batch row's keys kept from a random start on (the first's past the first 64-key tile, the
    last's past the end: masked entirely)."""
    shapes = {t.name: (t.shape, t.dtype) for t in net_build().inputs}

    def make(rng):
        out = {n: rng.standard_normal(s).astype(np.float32) * 2 for n, (s, dt) in shapes.items() if dt != "bool"}
        if mask_shape and left_padding:
            b, sk = mask_shape[0], mask_shape[-1]
            starts = rng.integers(0, sk, b)
            starts[0], starts[-1] = min(70, sk - 1), sk
            out["mask"] = np.broadcast_to((np.arange(sk) >= starts[:, None]).reshape(b, 1, 1, sk), mask_shape).copy()
        elif mask_shape:
            keep = rng.random(mask_shape) > 0.3
            keep.reshape(-1, keep.shape[-1])[0] = False  # a fully masked row: a uniform softmax over every key
            out["mask"] = keep
        return out
    return make


CASES = {  # (b, sq, sk, heads, d, mask shape, causal, packed)
    "bert_padding": (3, 100, 100, 2, 64, "key", False, True),
    "causal": (2, 130, 130, 2, 64, None, True, True),
    "causal_padding": (2, 77, 77, 3, 64, "key", True, True),
    "query_key_mask": (2, 70, 70, 2, 128, "full", False, True),
    "gpt2_causal_padding": (2, 128, 128, 2, 64, "full", True, True),  # a row per query, staged by cp.async
    "row_mask_partial_tiles": (2, 80, 96, 2, 128, "full", False, True),
    "head_mask": (2, 65, 65, 2, 128, "heads", False, True),
    "cross": (2, 33, 150, 2, 64, "key", False, True),
    "unpacked": (2, 40, 96, 3, 64, "full", True, False),
    "plain": (2, 128, 128, 4, 128, None, False, True),
    "vit_tokens": (2, 197, 197, 3, 64, None, False, True),  # partial tiles, no mask
    "cross_plain": (2, 33, 150, 2, 64, None, False, True),
    "unpacked_causal": (2, 40, 40, 3, 64, None, True, False),
    "left_padding": (3, 150, 150, 2, 64, "left", False, True),
    "left_padding_causal": (3, 150, 150, 2, 64, "left", True, True),
}
MASKS = {"key": lambda b, h, sq, sk: (b, 1, 1, sk), "full": lambda b, h, sq, sk: (b, 1, sq, sk),
         "heads": lambda b, h, sq, sk: (1, h, sq, sk), "left": lambda b, h, sq, sk: (b, 1, 1, sk)}


def case(name):
    b, sq, sk, h, d, mask, causal, packed = CASES[name]
    shape = MASKS[mask](b, h, sq, sk) if mask else None
    build = attention_net(b, sq, sk, h, d, shape, causal, packed=packed)
    return build, attention_inputs(build, shape, left_padding=mask == "left")


@pytest.mark.parametrize("op, precision", [("gemm", "FP32"), ("gemm", "FP16"), ("flash4", "FP16"),
                                          ("flash8", "FP16")])
@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_candidates(name, op, precision, monkeypatch):
    only(monkeypatch, op)
    engine = compare(*case(name), precision=precision, runs=3)
    assert engine.tactics["attention"]["op"] == ("gemm_attention" if op == "gemm" else "flash_attention")


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c[7] or c[5] is None))
def test_cudnn_attention(name, monkeypatch):
    """cuDNN's fused attention where it is a candidate: packed heads with any mask (rows masked entirely among
    them), causal or not; unpacked without a mask."""
    only(monkeypatch, "cudnn")
    engine = compare(*case(name), precision="FP16", runs=3)
    assert engine.tactics["attention"]["op"] == "cudnn_sdpa"


@pytest.mark.parametrize("mask_value", [-1e4, -30.0])
def test_a_mask_value_that_weighs_reaches_every_key(mask_value, monkeypatch):
    """Keys masked with a moderate value still count (causal tiles above the diagonal are not skipped)."""
    only(monkeypatch, "flash8")
    build = attention_net(2, 130, 130, 2, 64, None, True, mask_value)
    compare(build, attention_inputs(build, None), precision="FP16")


@pytest.mark.parametrize("op, name", [("gemm", "causal_padding"), ("flash4", "causal_padding"),
                                      ("flash8", "causal_padding"), ("cudnn", "causal_padding")])
def test_replays_equal_the_eager_run_and_each_other(op, name, monkeypatch):
    """Run 1 is eager (and captures the graph), runs 2-20 replay it: every output bitwise the same."""
    only(monkeypatch, op)
    build, make = case(name)
    engine = cupy_engine(build(), "FP16")
    ctx = engine.create_execution_context()
    inputs = make(np.random.default_rng(3))
    first = ctx.execute(inputs)["y"]
    assert np.isfinite(first).all()
    for run in range(19):
        np.testing.assert_array_equal(ctx.execute(inputs)["y"], first, err_msg=f"run {run + 2}")
    fresh = make(np.random.default_rng(4))  # a replay on new inputs is not the old output
    assert_close(ctx.execute(fresh)["y"], engine_reference(build, fresh), "FP16")


def engine_reference(build, inputs):
    from tftrt_py.engine import Engine

    return Engine(build(), precision="FP32", backend="numpy").create_execution_context().execute(inputs)["y"]


def test_flash_is_a_candidate_only_where_it_runs(monkeypatch):
    for d, precision, n in ((64, "FP16", 2), (128, "FP16", 2), (32, "FP16", 0), (64, "FP32", 0)):
        ops = proposed(monkeypatch, attention_net(2, 16, 16, 2, d), precision)
        assert ops.count("flash_attention") == n and ops.count("gemm_attention") == 1, (d, precision, ops)


def test_cudnn_attention_is_a_candidate_where_masked_keys_cannot_weigh(monkeypatch):
    """Masked scores (a mask input, causal) weigh nothing through cuDNN (an added -inf): the layer's mask value must
    not weigh either; a mask input needs packed heads."""
    from tftrt_py.engine.backends.cupy import _device

    if _device.cudnn_module() is None:
        pytest.skip("no cuDNN frontend")
    cases = {"plain d32": (attention_net(2, 16, 16, 2, 32), "FP16", True),
             "causal": (attention_net(2, 16, 16, 2, 64, None, True), "FP16", True),
             "padding mask": (attention_net(2, 16, 16, 2, 64, (2, 1, 1, 16)), "FP16", True),
             "padding mask, weighing mask value": (attention_net(2, 16, 16, 2, 64, (2, 1, 1, 16), False, -1e4),
                                                   "FP16", False),
             "unpacked with a mask": (attention_net(2, 16, 16, 2, 64, (2, 2, 16, 16), packed=False), "FP16", False),
             "causal, weighing mask value": (attention_net(2, 16, 16, 2, 64, None, True, -1e4), "FP16", False),
             "fp32": (attention_net(2, 16, 16, 2, 64), "FP32", False)}
    for name, (build, precision, expected) in cases.items():
        assert ("cudnn_sdpa" in proposed(monkeypatch, build, precision)) == expected, name


# -- INT8 and FP8 attention ----------------------------------------------------------------------------------------
def quantized_engine(net, precision):
    """`net` built in `precision` with every quantizable layer quantized (strict types), and the same network as
    the numpy backend computes it (its plan: the precisions the GPU build chose)."""
    import cupy

    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.runtime import deserialize

    if precision == "FP8" and int(cupy.cuda.Device().compute_capability) < 89:
        pytest.skip("FP8 needs compute capability 8.9")
    engine = Builder(BuilderConfig(precision=precision, backend="cupy", strict_types=True)).build_engine(net)
    return engine, deserialize(engine.serialize(), backend="numpy")


def with_ranges(build, value=7.0):
    """`build`'s network with a dynamic range on each float input (q, k and v engine inputs)."""
    net = build()
    for t in net.inputs:
        if t.dtype == "float32":
            t.dynamic_range = value
    return net


def rel_l2(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("precision", ["INT8", "FP8"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_quantized_attention_computes_the_contract(name, precision):
    """INT8 and FP8 Attention (packed heads): q, k and v quantized at their scales, as the numpy backend computes
    it on the same plan (the kernel's fp16 probabilities and base-2 exponent against fp32: within 5e-3), over
    fresh inputs, eager then replayed; unpacked attention runs in FP16 and says so."""
    build, make = case(name)
    engine, reference = quantized_engine(with_ranges(build), precision)
    layer = {l.name: l for l in engine.network.layers}["attention"]
    packed = CASES[name][7]
    assert layer.precision == (precision if packed else "FP16"), layer.precision
    assert engine.tactics["attention"]["op"].startswith("quantized_attention") == packed, engine.tactics
    ctx, ref_ctx, rng = engine.create_execution_context(), reference.create_execution_context(), \
        np.random.default_rng(5)
    for run in range(2):
        inputs = make(rng)
        got, want = ctx.execute(inputs)["y"], ref_ctx.execute(inputs)["y"]
        assert np.isfinite(got).all()
        err = rel_l2(got, want)
        print(f"{name} {precision} run {run}: relative L2 {err:.2e} against the numpy backend")
        assert err < 5e-3, err


@pytest.mark.parametrize("precision, storage", [("INT8", "int8"), ("FP8", "uint8")])
def test_a_bert_attention_block_stays_quantized_from_qkv_projection_to_output_projection(precision, storage):
    """x -> QKV projection -> attention (a padding mask) -> output projection: the projection writes q, k, v
    quantized, the attention reads them and writes its output quantized for the output projection, with one
    quantize step in all (the engine's input); the result is the numpy backend's (FP8: within 5e-2, as Hopper sums
    E4M3 products in a narrower accumulator, ops/triton_conv.py)."""
    b, s, w = 4, 128, 256
    net = attention_block_net(b, s, heads=4, d=64, dtype="float32", seed=7)
    engine, reference = quantized_engine(net, precision)
    prog = engine.cupy_program
    assert [s.layer for s in prog.steps if "quantize" in s.layer] == ["qkv (quantize)"], [s.layer for s in prog.steps]
    assert prog.root("qkv_seq:0").dtype == storage and prog.root("context:0").dtype == storage, prog.slots
    rng = np.random.default_rng(7)
    keep = np.arange(s)[None, :] < rng.integers(s // 2, s + 1, b)[:, None]
    feed = {"x": rng.uniform(-3, 3, (b * s, w)).astype(np.float32), "mask": keep.reshape(b, 1, 1, s)}
    err = rel_l2(engine.create_execution_context().execute(feed)["y"],
                 reference.create_execution_context().execute(feed)["y"])
    print(f"{precision} attention block: relative L2 {err:.2e} against the numpy backend")
    assert err < (1e-2 if precision == "INT8" else 5e-2), err


# -- residual LayerNorm ------------------------------------------------------------------------------------------
def norm_net(shape, residual):
    rng = np.random.default_rng(shape[-1])
    weights = {"scale": rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32),
               "bias": (rng.standard_normal(shape[-1]) * 0.1).astype(np.float32)}

    def build():
        net = Network("norm")
        ins = [net.add_input(f"x{i}", "float32", shape) for i in range(2 if residual else 1)]
        net.mark_output(net.add_layer("Normalization", ins, {"epsilon": 1e-5}, weights, name="norm").outputs[0],
                        name="y")
        return net
    return build


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("width, one_pass", [(768, True), (200, True), (8192, True), (202, False), (48, True)])
def test_layer_norm(width, one_pass, residual, precision):
    shape = (5, 37, width)

    def make(rng):
        # an offset mean (the one-pass kernel still centres before squaring)
        return {f"x{i}": (rng.standard_normal(shape) * 3 + 5).astype(np.float32) for i in range(2 if residual else 1)}

    engine = compare(norm_net(shape, residual), make, precision=precision, runs=3)
    assert engine.tactics["norm"]["op"] == ("layer_norm_one_pass" if one_pass else "layer_norm_kernel")


def test_a_plan_keeps_the_flash_block_size(monkeypatch):
    """A plan records the warps of its flash tactic; loading it rebuilds that block size, not the first one."""
    from tftrt_py.engine import Runtime
    from tftrt_py.engine.backends.cupy.ops import attention
    from tftrt_py.engine.backends.cupy.ops.base import FACTORIES

    only(monkeypatch, "flash8")
    engine = cupy_engine(attention_net(2, 64, 64, 2, 64)(), "FP16")
    monkeypatch.setitem(FACTORIES, "Attention", attention.attention_candidates)
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert loaded.tactics["attention"]["op"] == "flash_attention" and loaded.tactics["attention"]["warps"] == 8


def test_a_plan_keeps_the_cudnn_attention_plan(monkeypatch):
    """A plan records cuDNN's attention plan by name; loading it builds that plan again (the record, its time
    included, comes back unchanged: nothing was re-timed)."""
    from tftrt_py.engine import Runtime
    from tftrt_py.engine.backends.cupy.ops import attention
    from tftrt_py.engine.backends.cupy.ops.base import FACTORIES

    only(monkeypatch, "cudnn")
    engine = cupy_engine(attention_net(2, 64, 64, 2, 64)(), "FP16")
    monkeypatch.setitem(FACTORIES, "Attention", attention.attention_candidates)
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert engine.tactics["attention"]["op"] == "cudnn_sdpa"
    assert loaded.tactics["attention"] == engine.tactics["attention"]
