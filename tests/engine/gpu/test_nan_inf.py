"""NaN and ±Inf on the cupy backend: every layer kind gives NaN and ±Inf exactly where the numpy backend does
(which tests/reliability/test_nan_inf.py holds to native TF), finite values within FP32 1e-4 / FP16 1e-2, on
inputs mixing NaN, +Inf and -Inf into random values (all-NaN rows and windows, Inf - Inf)."""
import numpy as np
import pytest

from gpu_helpers import GPU, cupy_engine, healthy_gpu, single  # noqa: F401 (autouse fixture)
from specials import finite, mismatch, poisoned
from tftrt_py.engine import Engine
from tftrt_py.engine import layer_ops
from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine.builder.precision import fp32_reason

pytestmark = GPU

TOL = {"FP32": 1e-4, "FP16": 1e-2}
X2, X3, X4 = (8, 6), (2, 8, 6), (2, 6, 6, 4)
ALPHAS = {"leaky_relu": (0.2, None), "elu": (1.0, None), "clip": (-0.5, 0.5)}
FLOAT_BINARY = [op for op in layer_ops.ELEMENTWISE_OPS if op not in ("and", "or", "bitwise_and")]
FLOAT_UNARY = [op for op in layer_ops.UNARY_OPS if op != "not"]
CONV = dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1], post_padding=[1, 1])
WINDOW = dict(window=[2, 2], strides=[1, 1], pre_padding=[0, 0], post_padding=[1, 1])


def _act(t):
    alpha, beta = ALPHAS.get(t, (None, None))
    return {k: v for k, v in dict(type=t, alpha=alpha, beta=beta).items() if v is not None}


#: name -> (kind, input specs [(dtype, shape)], params, weights, specials: inputs poisoned (True) or ±Inf only)
CASES = {
    **{f"activation_{t}": ("Activation", [X2], _act(t), None, True) for t in layer_ops.ACTIVATIONS},
    **{f"unary_{op}": ("Unary", [X2], dict(op=op), None, True) for op in FLOAT_UNARY},
    **{f"elementwise_{op}": ("ElementWise", [X2, X2], dict(op=op), None, True) for op in FLOAT_BINARY},
    **{f"reduce_{op}": ("Reduce", [X3], dict(op=op, axes=[-1], keep_dims=False), None, True)
       for op in layer_ops.REDUCE_OPS},
    "reduce_max_middle": ("Reduce", [X3], dict(op="max", axes=[1], keep_dims=True), None, True),
    "argreduce_max": ("ArgReduce", [X3], dict(op="max", axis=-1), None, True),
    "argreduce_min_middle": ("ArgReduce", [X3], dict(op="min", axis=1), None, True),
    "pooling_max": ("Pooling", [X4], dict(WINDOW, type="max"), None, True),
    "pooling_avg": ("Pooling", [X4], dict(WINDOW, type="avg"), None, True),
    "pooling_max_zero_padding": ("Pooling", [X4], dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1],
                                                       post_padding=[1, 1], count_include_pad=True), None, True),
    "pooling_max_8_channels": ("Pooling", [(2, 6, 6, 8)], dict(WINDOW, type="max"), None, True),  # fp16: 8 a thread
    "pooling_max_8_channels_zero_padding": ("Pooling", [(2, 6, 6, 8)], dict(
        type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1], post_padding=[1, 1], count_include_pad=True),
        None, True),
    "reduce_sum_run_before_last": ("Reduce", [X4], dict(op="sum", axes=[1, 2], keep_dims=False), None, True),
    "softmax": ("Softmax", [X3], dict(axis=-1), None, True),
    "softmax_middle": ("Softmax", [X3], dict(axis=1), None, True),
    "topk": ("TopK", [X3], dict(k=3, axis=-1), None, False),
    "identity_int32": ("Identity", [X2], dict(dtype="int32"), None, True),
    "identity_float16": ("Identity", [X2], dict(dtype="float16"), None, True),
    "scale": ("Scale", [X4], dict(channel_axis=-1, activation={"type": "elu", "alpha": 1.0}),
              dict(scale=finite((4,), 1), shift=finite((4,), 2)), True),
    "convolution_relu": ("Convolution", [X4], dict(CONV, activation={"type": "relu"}),
                         dict(kernel=finite((3, 3, 4, 8), 3), bias=finite((8,), 4)), True),
    "convolution_selu": ("Convolution", [X4], dict(CONV, activation={"type": "selu"}),
                         dict(kernel=finite((3, 3, 4, 8), 3)), True),
    "deconvolution": ("Deconvolution", [X4], dict(strides=[2, 2], pre_padding=[0, 0], output_spatial=[12, 12]),
                      dict(kernel=finite((2, 2, 3, 4), 5)), True),
    "matrix_multiply_elu": ("MatrixMultiply", [X2, (6, 5)], dict(activation={"type": "elu", "alpha": 1.0}), None,
                            True),
    "mlp": ("MLP", [X2], dict(activations=[{"type": "relu"}, {"type": "tanh"}]),
            dict(w0=finite((6, 8), 6), b0=finite((8,), 7), w1=finite((8, 5), 8), b1=finite((5,), 9)), True),
    "normalization": ("Normalization", [X3], dict(epsilon=1e-3), dict(scale=finite((6,), 10), bias=finite((6,), 11)),
                      True),
    "attention": ("Attention", [X3, X3, X3], dict(scale=0.5), None, True),
    "resize_linear": ("Resize", [X4], dict(mode="linear", sizes=[9, 11]), None, True),
    "resize_nearest": ("Resize", [X4], dict(mode="nearest", sizes=[9, 11]), None, True),
    "nms": ("NMS", [(2, 10, 1, 4), (2, 10, 3)], dict(max_output_size_per_class=4, max_total_size=6,
                                                      iou_threshold=0.5, score_threshold=0.1), None, True),
    "gather": ("Gather", [X2, ("int32", (4,))], dict(axis=1), None, True),
    "shuffle": ("Shuffle", [X3], dict(first_perm=[0, 2, 1]), None, True),
    "padding": ("Padding", [X2], dict(pre=[0, 1], post=[0, 2], value=float("nan")), None, True),
    "concatenation": ("Concatenation", [X2, X2], dict(axis=-1), None, True),
    "slice": ("Slice", [X2], dict(start=[0, 1], size=[8, 2], stride=[1, 2]), None, True),
    "bitcast": ("Bitcast", [X2], dict(dtype="int32"), None, True),
    "select": ("Select", [("bool", X2), X2, X2], {}, None, True),
}


def _inputs(specs, specials, seed):
    out = {}
    for i, spec in enumerate(specs):
        dtype, shape = spec if isinstance(spec[0], str) else ("float32", spec)
        if dtype == "int32":
            out[f"x{i}"] = np.array([3, 0, 5, 0], np.int32)
        elif dtype == "bool":
            out[f"x{i}"] = np.random.default_rng(seed).random(shape) > 0.5
        else:
            out[f"x{i}"] = poisoned(shape, seed + i, only_inf=not specials)
    return out


def _engines(name, precision):
    kind, specs, params, weights, _ = CASES[name]
    specs = [s if isinstance(s[0], str) else ("float32", s) for s in specs]
    build = single(kind, specs, params, weights)
    ref, gpu = build(), cupy_engine(build(), precision)
    for net in (ref, gpu.network):  # as the builder assigns them: kinds such as Bitcast keep fp32
        for layer in net.layers:
            layer.precision = None if layer.kind == "Constant" else (
                "FP32" if precision != "FP32" and fp32_reason(layer) else precision)
    return Engine(ref, precision=precision, backend="numpy"), gpu


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_cupy_gives_nan_and_inf_where_numpy_does(name, precision):
    """FP16 compares where NaN and ±Inf fall only (as tests/reliability does): fp16 overflows finite values
    that fp32 keeps, and cuDNN's fp16 convolutions accumulate them in their own order."""
    ref, engine = _engines(name, precision)
    inputs = _inputs(CASES[name][1], CASES[name][4], seed=sum(map(ord, name)))
    want = ref.create_execution_context().execute(inputs)
    got = engine.create_execution_context().execute(inputs)
    for key in want:
        why = mismatch(got[key], want[key], TOL[precision] if precision == "FP32" else None)
        assert why is None, f"{name} {key} ({precision}): {why}"


def test_every_layer_kind_but_constant_has_a_case():
    """Constant layers hold weights: they compute nothing from the inputs."""
    assert {case[0] for case in CASES.values()} | {"Constant"} == set(layer_kinds.kinds())
