"""Small engine networks built directly with the Network API, shared by the engine tests."""
import numpy as np

from tftrt_py.engine import Network


def conv_relu_pool_net(batch=4):
    """input [batch, 8, 8, 3] -> conv 3x3 (bias, relu) -> 2x2 avg pool -> mean over H, W."""
    rng = np.random.default_rng(0)
    net = Network("conv_net")
    x = net.add_input("TensorRTInputPH_0", "float32", (batch, 8, 8, 3))
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
                                                  post_padding=[1, 1], groups=1, activation={"type": "relu"}),
                         {"kernel": rng.standard_normal((3, 3, 3, 5)).astype("float32"),
                          "bias": rng.standard_normal(5).astype("float32")}, name="conv")
    pool = net.add_layer("Pooling", conv.outputs, dict(type="avg", window=[2, 2], strides=[2, 2],
                                                       pre_padding=[0, 0], post_padding=[0, 0]), name="pool")
    mean = net.add_layer("Reduce", pool.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    net.mark_output(mean.outputs[0], name="TensorRTOutputPH_0")
    return net


#: The quantized Attention networks (quantized_attention_net) by case: the shape of their bool mask, or None.
ATTENTION_MASKS = {"fused": None, "masked": (2, 1, 1, 6), "causal": None, "separate": (2, 6, 6)}


def _qkv_shapes(case: str) -> dict:
    """The q, k, v inputs of quantized_attention_net(case) by name: three, or one fused QKV tensor."""
    return {n: (2, 6, 4) for n in "qkv"} if case == "separate" else {"qkv": (2, 6, 24)}


def quantized_attention_net(case: str) -> Network:
    """One Attention (scale 0.5) on inputs with dynamic ranges: "fused", "masked" and "causal" read q, k and v as
    column windows of one [2, 6, 24] tensor of range 2.5 (a fused QKV projection; 2 packed heads of 4), "masked"
    with a padding mask [2, 1, 1, 6], "causal" with the causal triangle; "separate" reads q, k, v [2, 6, 4] of
    ranges 1.5, 2.5 and 3 with a mask per query [2, 6, 6]."""
    net = Network(f"attention_{case}")
    shapes = _qkv_shapes(case)
    for (name, shape), amax in zip(shapes.items(), (1.5, 2.5, 3.0) if len(shapes) == 3 else (2.5,)):
        net.add_input(name, "float32", shape).dynamic_range = amax
    inputs = list(net.inputs) if len(shapes) == 3 else net.inputs * 3
    params = {"heads": None} if len(shapes) == 3 else {"heads": 2, "columns": [[0, 8], [8, 8], [16, 8]]}
    if ATTENTION_MASKS[case]:
        inputs.append(net.add_input("mask", "bool", ATTENTION_MASKS[case]))
    if ATTENTION_MASKS[case] or case == "causal":
        params.update(causal=case == "causal", mask_value=-1e9)
    net.mark_output(net.add_layer("Attention", inputs, dict(params, scale=0.5), name="attention").outputs[0],
                    name="y")
    return net


def quantized_attention_inputs(case: str, rng: np.random.Generator) -> dict:
    """Standard normal q, k, v for quantized_attention_net(case) (some beyond their ranges: clipped, saturated in
    FP8) and its mask (about 30% of the scores masked, all of the first sequence's: a uniform softmax)."""
    shapes = _qkv_shapes(case)
    values = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    if ATTENTION_MASKS[case]:
        keep = rng.random(ATTENTION_MASKS[case]) > 0.3
        keep[0] = False
        values["mask"] = keep
    return values


def attention_block_net(b=2, s=16, heads=2, d=32, dtype="float16", seed=5):
    """x [b*s, w] -> QKV projection -> reshape to [b, s, 3w] -> Attention (q, k, v: its column windows; a padding
    mask [b, 1, 1, s]) -> reshape to rows -> output projection -> y; ranges: x 3, the QKV output and its view 5,
    the attention's output and its view 2 (each view at its tensor's)."""
    rng = np.random.default_rng(seed)
    w = heads * d
    net = Network("attention_block")
    x = net.add_input("x", dtype, (b * s, w))
    mask = net.add_input("mask", "bool", (b, 1, 1, s))
    weights = [(rng.standard_normal(shape) / np.sqrt(w)).astype(np.float32) for shape in ((w, 3 * w), (w, w))]
    qkv = net.add_layer("MatrixMultiply", [x, net.add_constant(weights[0], name="w_qkv")], {}, name="qkv")
    seq = net.add_layer("Shuffle", [qkv.outputs[0]], {"reshape": [b, s, 3 * w]}, name="qkv_seq").outputs[0]
    att = net.add_layer("Attention", [seq, seq, seq, mask], {"heads": heads, "columns": [[0, w], [w, w], [2 * w, w]],
                                                             "scale": d ** -0.5, "mask_value": -1e9}, name="attention")
    rows = net.add_layer("Shuffle", [att.outputs[0]], {"reshape": [b * s, w]}, name="context").outputs[0]
    o = net.add_layer("MatrixMultiply", [rows, net.add_constant(weights[1], name="w_o")], {}, name="o")
    net.mark_output(o.outputs[0], name="y")
    x.dynamic_range, qkv.outputs[0].dynamic_range, seq.dynamic_range = 3.0, 5.0, 5.0
    att.outputs[0].dynamic_range = rows.dynamic_range = 2.0
    return net
