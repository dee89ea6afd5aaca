"""Every layer kind on the cupy backend against the numpy backend (FP32 1e-4, FP16 1e-2)."""
import numpy as np
import pytest

from tftrt_py.engine import layer_ops
from tftrt_py.engine.builder.fusions.activation import SIXTH

from gpu_helpers import GPU, compare, healthy_gpu, normal, single  # noqa: F401 (autouse fixture)

pytestmark = GPU

PRECISIONS = ["FP32", "FP16"]


@pytest.fixture(autouse=True)
def check_every_tactic(monkeypatch):
    """Build every candidate of every layer and check each against the numpy backend."""
    monkeypatch.setenv("TFTRT_PY_CHECK_TACTICS", "1")
    monkeypatch.setenv("TFTRT_PY_CUDNN_PLANS", "3")
rng0 = np.random.default_rng(1234)


def conv_params(k=3, stride=1, pad=1, dil=1, groups=1, nsp=2, act=None, pre=None, post=None):
    p = dict(strides=[stride] * nsp, dilations=[dil] * nsp, pre_padding=pre or [pad] * nsp,
             post_padding=post or [pad] * nsp, groups=groups)
    if act:
        p["activation"] = act
    return p


def kernel(*shape):
    fan_in = int(np.prod(shape[:-1]))
    return (rng0.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


CONV_CASES = {
    "3x3_bias_relu": ((2, 9, 9, 8), conv_params(act={"type": "relu"}), (3, 3, 8, 16), True),
    "stride2_asym_pad": ((2, 10, 11, 8), conv_params(stride=2, pre=[0, 1], post=[1, 2]), (3, 3, 8, 8), True),
    "dilated": ((1, 12, 12, 8), conv_params(dil=2, pad=2), (3, 3, 8, 8), False),
    "grouped": ((2, 8, 8, 8), conv_params(groups=2, act={"type": "relu6"}), (3, 3, 4, 8), True),
    "depthwise": ((2, 8, 8, 16), conv_params(groups=16), (3, 3, 1, 16), True),
    "1x1": ((2, 7, 7, 32), conv_params(k=1, pad=0), (1, 1, 32, 64), True),
    "stem_c3": ((2, 16, 16, 3), conv_params(stride=2, pad=3, act={"type": "relu"}), (7, 7, 3, 16), True),
    "patches_c3": ((2, 16, 16, 3), conv_params(k=4, stride=4, pad=0), (4, 4, 3, 32), True),  # a ViT's patch embedding
    "leaky": ((1, 6, 6, 8), conv_params(act={"type": "leaky_relu", "alpha": 0.2}), (3, 3, 8, 8), True),
    "sigmoid": ((1, 6, 6, 8), conv_params(act={"type": "sigmoid"}), (3, 3, 8, 8), True),
    "swish": ((1, 6, 6, 8), conv_params(act={"type": "swish"}), (3, 3, 8, 8), True),
    "gelu_tanh": ((1, 6, 6, 8), conv_params(act={"type": "gelu_tanh"}), (3, 3, 8, 8), True),
    "selu_epilogue": ((1, 6, 6, 8), conv_params(act={"type": "selu"}), (3, 3, 8, 8), True),
    "clip": ((1, 6, 6, 8), conv_params(act={"type": "clip", "alpha": -0.5, "beta": 0.5}), (3, 3, 8, 8), True),
    "hard_swish_epilogue": ((1, 6, 6, 8), conv_params(act={"type": "hard_swish"}), (3, 3, 8, 8), True),
    "hard_sigmoid_epilogue": ((1, 6, 6, 8), conv_params(act={"type": "hard_sigmoid", "alpha": SIXTH}), (3, 3, 8, 8),
                              True),
    "depthwise_hard_swish": ((2, 8, 8, 16), conv_params(groups=16, act={"type": "hard_swish", "alpha": SIXTH}),
                             (3, 3, 1, 16), True),
    "conv1d": ((2, 20, 8), conv_params(nsp=1), (3, 8, 16), True),
    "conv3d": ((1, 5, 6, 7, 8), conv_params(nsp=3), (3, 3, 3, 8, 8), True),
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_convolution(case, precision):
    shape, params, kshape, bias = CONV_CASES[case]
    weights = {"kernel": kernel(*kshape)}
    if bias:
        weights["bias"] = rng0.standard_normal(kshape[-1]).astype(np.float32)
    engine = compare(single("Convolution", [("float32", shape)], params, weights), normal(shape), precision)
    program = getattr(engine, "cupy_program", None)  # None where test_ort_layers reruns this case on onnxruntime
    if case.startswith("patches") and program is not None:  # the im2col GEMM is timed (and checked) beside cuDNN
        assert "gemm_conv" in {r["tactic"]["op"] for r in program.tuning_report}, program.tuning_report


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("residual_batch", [2, 1])
def test_convolution_residual(precision, residual_batch):
    shape, out = (2, 8, 8, 16), (residual_batch, 8, 8, 16)
    params = conv_params(act={"type": "relu"})
    weights = {"kernel": kernel(3, 3, 16, 16), "bias": rng0.standard_normal(16).astype(np.float32)}
    compare(single("Convolution", [("float32", shape), ("float32", out)], params, weights), normal(shape, out),
            precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_deconvolution(precision):
    params = dict(strides=[2, 2], pre_padding=[1, 1], post_padding=[1, 1], output_spatial=[10, 12])
    build = single("Deconvolution", [("float32", (2, 5, 6, 8))], params, {"kernel": kernel(3, 3, 4, 8)})
    compare(build, normal((2, 5, 6, 8)), precision)


MATMUL_CASES = {
    "2d": ((16, 32), (32, 24), {}),
    "batched": ((3, 16, 32), (3, 32, 8), {}),
    "transposes": ((2, 32, 16), (2, 8, 32), {"transpose_a": True, "transpose_b": True}),
    "broadcast_b": ((4, 5, 16), (16, 8), {}),
    "partial_broadcast": ((2, 1, 5, 16), (1, 3, 16, 8), {}),
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_matrix_multiply(case, precision):
    sa, sb, params = MATMUL_CASES[case]
    compare(single("MatrixMultiply", [("float32", sa), ("float32", sb)], params), normal(sa, sb), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("act", [{"type": "gelu_erf"}, {"type": "hard_swish"},
                                 {"type": "hard_sigmoid", "alpha": SIXTH}], ids=lambda a: a["type"])
def test_matrix_multiply_constant_bias_activation(act, precision):
    from tftrt_py.engine import Network

    w, bias = kernel(64, 48), rng0.standard_normal(48).astype(np.float32)

    def build():
        net = Network("fc")
        x = net.add_input("x0", "float32", (8, 64))
        y = net.add_layer("MatrixMultiply", [x, net.add_constant(w)], {"activation": act},
                          {"bias": bias}).outputs[0]
        net.mark_output(y, name="y0")
        return net

    compare(build, normal((8, 64)), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_mlp(precision):
    weights = {"w0": kernel(32, 64), "b0": rng0.standard_normal(64).astype(np.float32),
               "w1": kernel(64, 16), "b1": rng0.standard_normal(16).astype(np.float32)}
    params = {"activations": [{"type": "relu"}, None]}
    compare(single("MLP", [("float32", (8, 32))], params, weights), normal((8, 32)), precision)


#: Residual GEMMs: (a, b, bias, activation); 2-d products take cuBLASLt's C operand, batched ones the epilogue kernel.
RESIDUAL_CASES = {
    "2d": ((16, 32), (32, 24), False, None),
    "2d_bias_gelu_tanh": ((16, 32), (32, 24), True, {"type": "gelu_tanh"}),
    "2d_bias_relu": ((16, 32), (32, 24), True, {"type": "relu"}),
    "batched_bias": ((3, 16, 32), (32, 8), True, None),
    "2d_bias_gelu_erf_odd": ((16, 32), (32, 23), True, {"type": "gelu_erf"}),  # the epilogue's unvectorised path
}


@pytest.mark.parametrize("gemm", ["cublas", "cublaslt"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", sorted(RESIDUAL_CASES))
def test_matrix_multiply_with_residual(case, precision, gemm, monkeypatch):
    """y = act(a @ b + bias + r): r added before the activation (``TFTRT_PY_GEMM`` picks the cupy path)."""
    from tftrt_py.engine import Network

    monkeypatch.setenv("TFTRT_PY_GEMM", gemm)
    sa, sb, has_bias, act = RESIDUAL_CASES[case]
    w, bias = kernel(*sb), rng0.standard_normal(sb[-1]).astype(np.float32)
    out = (*sa[:-1], sb[-1])

    def build():
        net = Network("residual_fc")
        x, r = net.add_input("x0", "float32", sa), net.add_input("x1", "float32", out)
        y = net.add_layer("MatrixMultiply", [x, net.add_constant(w), r], {"activation": act},
                          {"bias": bias} if has_bias else {}).outputs[0]
        net.mark_output(y, name="y0")
        return net

    compare(build, normal(sa, out), precision)


@pytest.mark.parametrize("gemm", ["cublas", "cublaslt"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("last", [None, {"type": "gelu_tanh"}], ids=["linear", "gelu_tanh"])
def test_mlp_with_residual(last, precision, gemm, monkeypatch):
    """A pre-norm FFN: x2 = act(gelu(x W0 + b0) W1 + b1 + r)."""
    monkeypatch.setenv("TFTRT_PY_GEMM", gemm)
    weights = {"w0": kernel(32, 64), "b0": rng0.standard_normal(64).astype(np.float32),
               "w1": kernel(64, 32), "b1": rng0.standard_normal(32).astype(np.float32)}
    params = {"activations": [{"type": "gelu_tanh"}, last]}
    compare(single("MLP", [("float32", (8, 32)), ("float32", (8, 32))], params, weights), normal((8, 32), (8, 32)),
            precision)


@pytest.mark.parametrize("op", [op for op in layer_ops.ELEMENTWISE_OPS if op != "bitwise_and"])  # ints only
def test_elementwise_fp32(op):
    shapes = ((2, 3, 4), (3, 1))
    if op in ("and", "or"):
        def make(rng):
            return {"x0": rng.uniform(size=shapes[0]) > 0.5, "x1": rng.uniform(size=shapes[1]) > 0.5}
        dtype = "bool"
    elif op == "pow":
        make, dtype = normal(*shapes, low=0.5, high=2.0), "float32"
    else:
        make, dtype = normal(*shapes), "float32"
    compare(single("ElementWise", [(dtype, shapes[0]), (dtype, shapes[1])], {"op": op}), make, "FP32")


@pytest.mark.parametrize("op", ["sum", "sub", "prod", "div", "max", "min", "floor_div", "floor_mod", "pow", "equal",
                                "less"])
def test_elementwise_int32(op):
    shapes = ((4, 5), (4, 5))

    def make(rng):
        a = rng.integers(-20, 20, shapes[0]).astype(np.int32)
        b = rng.integers(1, 6, shapes[1]).astype(np.int32) * rng.choice([-1, 1], shapes[1]).astype(np.int32)
        if op == "pow":
            b = np.abs(b)
        return {"x0": a, "x1": b}

    compare(single("ElementWise", [("int32", shapes[0]), ("int32", shapes[1])], {"op": op}), make, "FP32")


@pytest.mark.parametrize("op", ["sum", "sub", "prod", "div", "max", "min", "squared_difference"])
def test_elementwise_fp16(op):
    shapes = ((2, 3, 4), (4,))
    compare(single("ElementWise", [("float32", shapes[0]), ("float32", shapes[1])], {"op": op}),
            normal(*shapes, low=0.5, high=2.0), "FP16")


INT32_EDGES = np.array([-2 ** 31, 2 ** 31 - 1, -46341, 46341, 0, -1], np.int32)  # wrap in abs, neg, square


def ints(rng, shape, dtype, low, high, edges=()):
    """Random integers in [low, high) with `edges` written over the first entries (overflow cases)."""
    a = rng.integers(low, high, shape, dtype=np.int64).astype(dtype)
    n = min(len(edges), a.size)
    a.reshape(-1)[:n] = edges[:n]
    return a


@pytest.mark.parametrize("op", ["squared_difference", "bitwise_and", "not_equal", "greater", "greater_equal",
                                "less_equal"])
def test_elementwise_int32_exact(op):
    """The int32 ops the converters emit besides test_elementwise_int32's: wrapping, bit for bit."""
    def make(rng):
        return {"x0": ints(rng, (4, 6), np.int32, -2 ** 31, 2 ** 31, INT32_EDGES),
                "x1": ints(rng, (6,), np.int32, -2 ** 31, 2 ** 31, INT32_EDGES[::-1])}

    compare(single("ElementWise", [("int32", (4, 6)), ("int32", (6,))], {"op": op}), make)


@pytest.mark.parametrize("op", ["abs", "neg", "sign", "square"])
def test_unary_int32(op):
    def make(rng):
        return {"x0": ints(rng, (5, 7), np.int32, -70000, 70000, INT32_EDGES)}

    compare(single("Unary", [("int32", (5, 7))], {"op": op}), make)


INT64_OPS = ["sum", "sub", "prod", "max", "min", "equal", "not_equal", "less", "greater_equal", "bitwise_and"]


@pytest.mark.parametrize("op", INT64_OPS)
def test_elementwise_int64(op):
    """Beyond int32's range, products wrapping at 2**64: exact."""
    edges = np.array([2 ** 62, -2 ** 63, 2 ** 63 - 1, 2 ** 31, -1], np.int64)

    def make(rng):
        return {"x0": ints(rng, (3, 4, 5), np.int64, -2 ** 40, 2 ** 40, edges),
                "x1": ints(rng, (4, 1), np.int64, -2 ** 40, 2 ** 40, edges[::-1])}

    compare(single("ElementWise", [("int64", (3, 4, 5)), ("int64", (4, 1))], {"op": op}), make)


def int64_values(*shapes):
    def make(rng):
        return {f"x{i}": ints(rng, s, np.int64, -2 ** 50, 2 ** 50) for i, s in enumerate(shapes)}

    return make


@pytest.mark.parametrize("dtype", ["int32", "float32", "bool"])
def test_identity_int64_casts(dtype):
    compare(single("Identity", [("int64", (4, 9))], {"dtype": dtype}), int64_values((4, 9)))

    def make(rng):
        values = {"int32": lambda: ints(rng, (4, 9), np.int32, -2 ** 31, 2 ** 31),
                  "float32": lambda: rng.uniform(-1e6, 1e6, (4, 9)).astype(np.float32),
                  "bool": lambda: rng.uniform(size=(4, 9)) > 0.5}
        return {"x0": values[dtype]()}

    compare(single("Identity", [(dtype, (4, 9))], {"dtype": "int64"}), make)


def test_int64_data_movement():
    """Shuffle, Slice (reversed), Concatenation, Padding, Gather (int64 params and indices), Select and
    Reduce keep int64 values exact, through int64 bindings."""
    compare(single("Shuffle", [("int64", (2, 3, 4))], {"first_perm": [2, 0, 1]}), int64_values((2, 3, 4)))
    compare(single("Slice", [("int64", (6, 8))], {"start": [5, 7], "size": [6, 4], "stride": [-1, -2]}),
            int64_values((6, 8)))
    compare(single("Concatenation", [("int64", (2, 3)), ("int64", (2, 5))], {"axis": 1}),
            int64_values((2, 3), (2, 5)))
    compare(single("Padding", [("int64", (2, 4))], {"pre": [0, 1], "post": [1, 2], "mode": "constant", "value": 7}),
            int64_values((2, 4)))

    def gather_inputs(rng):
        return {"x0": ints(rng, (5, 6), np.int64, -2 ** 50, 2 ** 50), "x1": rng.integers(0, 5, (2, 3))}

    compare(single("Gather", [("int64", (5, 6)), ("int64", (2, 3))], {"axis": 0}), gather_inputs)

    def select_inputs(rng):
        return {"x0": rng.uniform(size=(3, 1)) > 0.5, **{f"x{i + 1}": v for i, v in
                                                        enumerate(int64_values((3, 5), (5,))(rng).values())}}

    compare(single("Select", [("bool", (3, 1)), ("int64", (3, 5)), ("int64", (5,))], {}), select_inputs)
    for op in ("sum", "max", "min"):
        compare(single("Reduce", [("int64", (3, 4, 5))], {"op": op, "axes": [0, 2]}), int64_values((3, 4, 5)))


@pytest.mark.parametrize("op,keep_dims", [("min", False), ("max", True)])
def test_reduce_bool(op, keep_dims):
    """All and Any: the min and max of bools, over several axes."""
    def make(rng):
        return {"x0": rng.uniform(size=(4, 3, 5)) > 0.3}

    compare(single("Reduce", [("bool", (4, 3, 5))], {"op": op, "axes": [1, 2], "keep_dims": keep_dims}), make)


def test_bitcast():
    compare(single("Bitcast", [("float32", (4, 6))], {"dtype": "int32"}), normal((4, 6), low=-1e3, high=1e3))

    def bits(rng):
        return {"x0": rng.integers(-2 ** 31, 2 ** 31, (4, 6)).astype(np.int32)}

    compare(single("Bitcast", [("int32", (4, 6))], {"dtype": "float32"}), bits)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_bitcast_bitwise_and_chain(precision):
    """|-x| as the bits of -x with the sign bit cleared; in FP16 engines the bitcasts read and write float32
    (the negation's fp16 values, widened exactly)."""
    from tftrt_py.engine import Network

    def build():
        net = Network("abs_bits")
        x = net.add_layer("Unary", [net.add_input("x0", "float32", (3, 8))], {"op": "neg"}).outputs[0]
        i = net.add_layer("Bitcast", [x], {"dtype": "int32"}).outputs[0]
        m = net.add_layer("ElementWise", [i, net.add_constant(np.array([0x7FFFFFFF], np.int32))],
                          {"op": "bitwise_and"}).outputs[0]
        net.mark_output(net.add_layer("Bitcast", [m], {"dtype": "float32"}).outputs[0], name="y0")
        return net

    compare(build, normal((3, 8)), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_select_broadcast_patterns(dtype, precision):
    """The converters' Select patterns, each broadcasting on both sides: a [1, K] row repeated along the
    batch by a condition from the source's first column; BroadcastTo (a constant all-true condition over
    the broadcast dims); MatrixBandPart (a constant band mask, 0 elsewhere); a constant pinned to the
    batch by one row of the source."""
    from tftrt_py.engine import Network

    b, k = 5, 6
    row = (rng0.standard_normal((1, k)) * 100).astype(dtype)
    band = np.tril(np.ones((k, k), np.bool_)) & np.triu(np.ones((k, k), np.bool_), -1)
    pinned = np.arange(4, dtype=dtype).reshape(1, 4)

    def build():
        net = Network("select_patterns")
        src = net.add_input("x0", "float32", (b, 3))
        x = net.add_input("x1", dtype, (b, k, k))
        column = net.add_layer("Slice", [src], {"start": [0, 0], "size": [b, 1], "stride": [1, 1]}).outputs[0]
        cond = net.add_layer("Identity", [column], {"dtype": "bool"}).outputs[0]
        const = net.add_constant(row)
        rows = net.add_layer("Select", [cond, const, const]).outputs[0]  # [b, 1] and [1, k] -> [b, k]
        true = net.add_constant(np.ones((b, k, 1), np.bool_))
        vector = net.add_constant(row[0])
        bcast = net.add_layer("Select", [true, vector, vector]).outputs[0]  # [b, k, 1] and [k] -> [b, k, k]
        zero = net.add_constant(np.zeros((1,), dtype))
        banded = net.add_layer("Select", [net.add_constant(band), x, zero]).outputs[0]
        first = net.add_layer("Slice", [src], {"start": [0, 0], "size": [1, 1], "stride": [1, 1]}).outputs[0]
        pin = net.add_layer("Select", [net.add_constant(np.ones((1, 1), np.bool_)), net.add_constant(pinned),
                                       first]).outputs[0]
        for i, t in enumerate((rows, bcast, banded, pin)):
            net.mark_output(t, name=f"y{i}")
        return net

    def make(rng):
        x = rng.standard_normal((b, k, k)) * 100
        return {"x0": np.where(rng.uniform(size=(b, 3)) > 0.5, rng.standard_normal((b, 3)), 0).astype(np.float32),
                "x1": x.astype(dtype)}

    compare(build, make, precision)


UNARY_DOMAIN = {"log": (0.1, 3.0), "sqrt": (0.1, 3.0), "rsqrt": (0.1, 3.0), "recip": (0.5, 3.0),
                "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "acosh": (1.1, 3.0),
                "tan": (-1.2, 1.2)}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", layer_ops.UNARY_OPS)
def test_unary(op, precision):
    shape = (3, 17)
    if op == "not":
        compare(single("Unary", [("bool", shape)], {"op": op}), lambda rng: {"x0": rng.uniform(size=shape) > 0.5})
        return
    if precision == "FP16" and op in ("ceil", "floor", "round", "sign"):
        pytest.skip("rounding ops on float16-rounded inputs can land on the other side of a step")
    low, high = UNARY_DOMAIN.get(op, (-2.0, 2.0))
    compare(single("Unary", [("float32", shape)], {"op": op}), normal(shape, low=low, high=high), precision)


ACT_PARAMS = {"clip": {"alpha": -0.5, "beta": 0.7}, "leaky_relu": {"alpha": 0.1}, "elu": {"alpha": 1.3}}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("act", layer_ops.ACTIVATIONS)
def test_activation(act, precision):
    shape = (4, 33)
    params = dict({"type": act}, **ACT_PARAMS.get(act, {}))
    compare(single("Activation", [("float32", shape)], params), normal(shape, low=-4.0, high=4.0), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("act", ["hard_sigmoid", "hard_swish"])
def test_hard_activation_times_sixth(act, precision):
    """Keras MobileNetV3's form: relu6(x + 3) times float32(1/6), around the kinks at -3 and 3."""
    shape = (4, 33)
    compare(single("Activation", [("float32", shape)], {"type": act, "alpha": SIXTH}),
            normal(shape, low=-4.0, high=4.0), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("per_channel", [True, False])
def test_scale(per_channel, precision):
    n = 6 if per_channel else 1
    weights = {"scale": rng0.uniform(0.5, 1.5, n).astype(np.float32),
               "shift": rng0.uniform(0.5, 1.5, n).astype(np.float32),
               "power": rng0.uniform(1.0, 2.0, n).astype(np.float32)}
    params = {"channel_axis": 1, "activation": {"type": "tanh"}}
    compare(single("Scale", [("float32", (2, 6, 5))], params, weights), normal((2, 6, 5), low=0.1, high=1.0),
            precision)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_select(precision):
    shape = (3, 8)

    def make(rng):
        return {"x0": rng.uniform(size=shape) > 0.5, "x1": rng.standard_normal(shape).astype(np.float32),
                "x2": rng.standard_normal((8,)).astype(np.float32)}

    compare(single("Select", [("bool", shape), ("float32", shape), ("float32", (8,))], {}), make, precision)


@pytest.mark.parametrize("dtype", ["int32", "bool", "float16"])
def test_identity_cast(dtype):
    compare(single("Identity", [("float32", (4, 9))], {"dtype": dtype}), normal((4, 9), low=-5, high=5), "FP32")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fused_pointwise_chain(precision):
    from tftrt_py.engine import Network

    def build():
        net = Network("chain")
        a = net.add_input("x0", "float32", (2, 5, 7))
        b = net.add_input("x1", "float32", (7,))
        s = net.add_layer("ElementWise", [a, b], {"op": "sum"}).outputs[0]
        e = net.add_layer("Unary", [s], {"op": "exp"}).outputs[0]
        m = net.add_layer("ElementWise", [e, a], {"op": "prod"}).outputs[0]
        y = net.add_layer("Activation", [m], {"type": "tanh"}).outputs[0]
        net.mark_output(y, name="y0")
        net.mark_output(s, name="y1")  # an intermediate that is also an output stays materialized
        return net

    engine = compare(build, normal((2, 5, 7), (7,), low=-1, high=1), precision)
    fused = [t for t in engine.tactics.values() if t.get("op") == "pointwise"]
    assert max(len(t["fused"]) for t in fused) >= 3


POOL_CASES = {
    "max_pad": ("max", (2, 9, 9, 8), [3, 3], [2, 2], [1, 1], [1, 1], False),
    "avg_excl": ("avg", (2, 9, 9, 8), [3, 3], [2, 2], [1, 1], [1, 1], False),
    "avg_incl": ("avg", (2, 8, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], True),
    "max_1d": ("max", (2, 15, 4), [3], [2], [0], [0], False),
    "avg_3d": ("avg", (1, 4, 6, 6, 4), [2, 2, 2], [2, 2, 2], [0, 0, 0], [0, 0, 0], False),
    "global": ("avg", (2, 7, 7, 32), [7, 7], [1, 1], [0, 0], [0, 0], False),
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pooling(case, precision):
    kind, shape, window, strides, pre, post, incl = POOL_CASES[case]
    params = dict(type=kind, window=window, strides=strides, pre_padding=pre, post_padding=post,
                  count_include_pad=incl)
    compare(single("Pooling", [("float32", shape)], params), normal(shape), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", layer_ops.REDUCE_OPS)
def test_reduce(op, precision):
    shape = (3, 5, 6)
    low, high = (0.5, 1.5) if op in ("prod", "log_sum") else (-2.0, 2.0)
    params = {"op": op, "axes": [1, 2], "keep_dims": op in ("sum", "max")}
    compare(single("Reduce", [("float32", shape)], params), normal(shape, low=low, high=high), precision)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("op", layer_ops.REDUCE_OPS)
def test_reduce_over_a_run_of_axes_before_the_last(op, precision):
    """A global average pool's shape (NHWC over H and W)."""
    shape = (3, 5, 6, 40)
    low, high = (0.5, 1.5) if op in ("prod", "log_sum") else (-2.0, 2.0)
    params = {"op": op, "axes": [1, 2], "keep_dims": op in ("mean", "max")}
    compare(single("Reduce", [("float32", shape)], params), normal(shape, low=low, high=high), precision)


def test_reduce_over_a_run_of_axes_before_the_last_has_the_strided_kernel_as_a_candidate():
    """Both candidates are timed, and checked against the numpy backend like every candidate here."""
    shape = (2, 7, 7, 64)
    engine = compare(single("Reduce", [("float32", shape)], {"op": "mean", "axes": [1, 2]}), normal(shape), "FP16")
    assert {r["tactic"]["op"] for r in engine.cupy_program.tuning_report} == {"strided_reduce_kernel",
                                                                             "reduction_kernel"}


def test_reduce_first_perm_and_int():
    params = {"op": "sum", "axes": [2], "keep_dims": False, "first_perm": [0, 2, 1]}
    compare(single("Reduce", [("float32", (2, 4, 6))], params), normal((2, 4, 6)))
    compare(single("Reduce", [("int32", (2, 4, 6))], {"op": "max", "axes": [1]}), normal((2, 4, 6), dtype="int32"))


@pytest.mark.parametrize("op", ["max", "min"])
def test_argreduce(op):
    compare(single("ArgReduce", [("float32", (4, 9, 5))], {"op": op, "axis": 1}), normal((4, 9, 5)))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(axis, precision):
    compare(single("Softmax", [("float32", (3, 37, 5))], {"axis": axis}), normal((3, 37, 5)), precision)


ATTENTION_CASES = {  # q, k, v shapes and params; "packed": heads side by side in the last dim
    "plain": ([(2, 3, 16, 32), (2, 3, 24, 32), (2, 3, 24, 32)], {"scale": 0.17, "heads": None}),
    "packed": ([(2, 16, 4 * 32), (2, 24, 4 * 32), (2, 24, 4 * 32)], {"scale": 0.17, "heads": 4}),
    "packed_narrow_v": ([(3, 8, 2 * 64), (3, 8, 2 * 64), (3, 8, 2 * 16)], {"scale": 0.125, "heads": 2}),
    "odd_head_dim": ([(2, 5, 2 * 12), (2, 7, 2 * 12), (2, 7, 2 * 12)], {"scale": 0.3, "heads": 2}),
    "column_windows": ([(2, 16, 3 * 4 * 32)] * 3, {"scale": 0.17, "heads": 4,
                                                  "columns": [[0, 128], [128, 128], [256, 128]]}),
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention(case, precision):
    shapes, params = ATTENTION_CASES[case]
    engine = compare(single("Attention", [("float32", s) for s in shapes], params), normal(*shapes), precision)
    print(case, precision, engine.tactics)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("residual", [False, True])
def test_normalization(residual, precision):
    shape = (6, 7, 200)
    weights = {"scale": rng0.uniform(0.5, 1.5, 200).astype(np.float32),
               "bias": (rng0.standard_normal(200) * 0.1).astype(np.float32)}
    inputs = [shape] * (2 if residual else 1)
    compare(single("Normalization", [("float32", s) for s in inputs], {"epsilon": 1e-5}, weights), normal(*inputs),
            precision)


SHUFFLE_CASES = {
    "transpose": {"first_perm": [0, 2, 1, 3]},
    "reshape": {"reshape": [2, -1]},
    "transpose_reshape_transpose": {"first_perm": [0, 3, 1, 2], "reshape": [2, 4, 12], "second_perm": [0, 2, 1]},
    "view_perm": {"first_perm": [0, 1, 3, 2], "reshape": [2, 3, 4]},
}


@pytest.mark.parametrize("case", sorted(SHUFFLE_CASES))
def test_shuffle(case):
    shape = (2, 3, 4, 4) if case != "view_perm" else (2, 3, 4, 1)
    compare(single("Shuffle", [("float32", shape)], SHUFFLE_CASES[case]), normal(shape))


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_padding(mode):
    params = {"pre": [0, 1, 2], "post": [1, 0, 2], "mode": mode, "value": 0.5}
    compare(single("Padding", [("float32", (2, 4, 5))], params), normal((2, 4, 5)))


def test_concatenation_slice_gather():
    compare(single("Concatenation", [("float32", (2, 3, 4)), ("float32", (2, 5, 4))], {"axis": 1}),
            normal((2, 3, 4), (2, 5, 4)))
    compare(single("Slice", [("float32", (6, 8))], {"start": [5, 1], "size": [3, 3], "stride": [-2, 3]}),
            normal((6, 8)))

    def make(rng):
        return {"x0": rng.standard_normal((5, 6)).astype(np.float32), "x1": rng.integers(0, 6, (2, 3)).astype(np.int32)}

    compare(single("Gather", [("float32", (5, 6)), ("int32", (2, 3))], {"axis": 1}), make)


def test_topk_and_nms():
    compare(single("TopK", [("float32", (3, 20))], {"axis": -1, "k": 5}), normal((3, 20)))

    def make(rng):
        lo = rng.uniform(0, 0.6, (2, 12, 1, 2)).astype(np.float32)
        boxes = np.concatenate([lo, lo + rng.uniform(0.1, 0.4, (2, 12, 1, 2)).astype(np.float32)], axis=-1)
        return {"x0": boxes, "x1": rng.uniform(0, 1, (2, 12, 3)).astype(np.float32)}

    params = {"max_output_size_per_class": 4, "max_total_size": 6, "iou_threshold": 0.5, "score_threshold": 0.2}
    compare(single("NMS", [("float32", (2, 12, 1, 4)), ("float32", (2, 12, 3))], params), make)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("mode,align,half", [("nearest", False, False), ("nearest", True, False),
                                             ("linear", False, True), ("linear", True, False)])
def test_resize(mode, align, half, precision):
    params = {"mode": mode, "sizes": [9, 13], "align_corners": align, "half_pixel_centers": half}
    compare(single("Resize", [("float32", (2, 5, 6, 3))], params), normal((2, 5, 6, 3)), precision)


def test_constant_output_and_view_output():
    """An output that reshapes a computed tensor binds the buffer its producer writes (no copy); a constant
    output, and a second output over an already bound buffer, are copied into bindings of their own."""
    from tftrt_py.engine import Network

    def build():
        net = Network("views")
        x = net.add_input("x0", "float32", (2, 6))
        c = net.add_constant(np.arange(6, dtype=np.float32).reshape(1, 6))
        s = net.add_layer("ElementWise", [x, c], {"op": "sum"}).outputs[0]
        r = net.add_layer("Shuffle", [s], {"reshape": [3, 4]}).outputs[0]
        net.mark_output(r, name="y0")
        net.mark_output(c, name="y1")
        net.mark_output(s, name="y2")
        return net

    engine = compare(build, normal((2, 6)))
    program = getattr(engine, "cupy_program", None)  # None where test_ort_layers reruns this case on onnxruntime
    if program is not None:
        copies = sorted(step.layer for step in program.steps if step.layer.endswith("(output)"))
        assert copies == ["y1 (output)", "y2 (output)"], copies
