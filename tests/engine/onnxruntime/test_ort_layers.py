"""Every layer kind on the onnxruntime backend against the numpy backend: every case of the GPU layer suite
(tests/engine/gpu/test_layers.py, its `compare` pointed at onnxruntime), INT8 layers, and a lowering (or a
stated numpy fallback) for every kind."""
import importlib.util
import os

import numpy as np
import pytest

from tftrt_py.engine import layer_ops
from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine.backends.onnxruntime.graph import prune
from tftrt_py.engine.backends.onnxruntime.lowering import lower
from tftrt_py.engine.backends.onnxruntime.registry import LOWERINGS, NUMPY_KINDS

from gpu_helpers import normal, single
from ort_helpers import ORT, compare

pytestmark = ORT

#: GPU cases that check the cupy backend's own choices, not values.
CUPY_ONLY = {"test_fused_pointwise_chain",
             "test_reduce_over_a_run_of_axes_before_the_last_has_the_strided_kernel_as_a_candidate"}


def _gpu_cases():
    path = os.path.join(os.path.dirname(__file__), "..", "gpu", "test_layers.py")
    spec = importlib.util.spec_from_file_location("gpu_layer_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.compare = compare
    return module


_GPU = _gpu_cases()
globals().update({name: fn for name, fn in vars(_GPU).items() if name.startswith("test_") and name not in CUPY_ONLY})


def test_every_kind_has_a_lowering_or_a_stated_fallback():
    assert set(LOWERINGS) | set(NUMPY_KINDS) == set(layer_kinds.kinds())
    assert not set(LOWERINGS) & set(NUMPY_KINDS)
    assert set(NUMPY_KINDS) == {"NMS"}


INT8_CASES = {name: _GPU.CONV_CASES[name] for name in ("3x3_bias_relu", "stride2_asym_pad", "depthwise", "1x1",
                                                       "conv1d")}


def _with_ranges(build, ranges):
    def made():
        net = build()
        for t, amax in zip(net.inputs, ranges):
            t.dynamic_range = amax
        return net

    return made


@pytest.mark.parametrize("case", sorted(INT8_CASES))
def test_int8_convolution(case):
    shape, params, kshape, bias = INT8_CASES[case]
    weights = {"kernel": _GPU.kernel(*kshape)}
    if bias:
        weights["bias"] = _GPU.rng0.standard_normal(kshape[-1]).astype(np.float32)
    build = single("Convolution", [("float32", shape)], params, weights)
    compare(_with_ranges(build, [3.0]), normal(shape, low=-3.0, high=3.0), "INT8")


@pytest.mark.parametrize("case", ["2d", "batched", "transposes"])
def test_int8_matrix_multiply(case):
    sa, sb, params = _GPU.MATMUL_CASES[case]
    build = single("MatrixMultiply", [("float32", sa), ("float32", sb)], params)
    compare(_with_ranges(build, [2.0, 2.0]), normal(sa, sb, low=-2.0, high=2.0), "INT8")


def test_int8_matrix_multiply_constant_weights():
    """A constant operand is quantized per output column, as the numpy backend does."""
    from tftrt_py.engine import Network

    w, bias = _GPU.kernel(64, 48), _GPU.rng0.standard_normal(48).astype(np.float32)

    def build():
        net = Network("fc")
        x = net.add_input("x0", "float32", (8, 64))
        x.dynamic_range = 2.0
        y = net.add_layer("MatrixMultiply", [x, net.add_constant(w)], {"activation": {"type": "relu"}},
                          {"bias": bias}).outputs[0]
        net.mark_output(y, name="y0")
        return net

    compare(build, normal((8, 64), low=-2.0, high=2.0), "INT8")


@pytest.mark.parametrize("pre,post", [([1, 2, 0], [2, 1, 3]), ([0, 4, 5], [2, 4, 5])])
def test_symmetric_padding(pre, post):
    """MirrorPad's SYMMETRIC mode (edges repeated), which ONNX's Pad lacks."""
    params = {"pre": pre, "post": post, "mode": "symmetric"}
    compare(single("Padding", [("float32", (3, 4, 5))], params), normal((3, 4, 5)))


def test_float16_bindings():
    """float16 tensors keep their dtype at the bindings; layers compute them in fp32 and round where they write."""
    from tftrt_py.engine import Network

    w = _GPU.kernel(3, 3, 8, 8)

    def build():
        net = Network("half")
        x = net.add_input("x0", "float16", (2, 6, 6, 8))
        y = net.add_layer("Convolution", [x], _GPU.conv_params(act={"type": "relu"}), {"kernel": w}).outputs[0]
        s = net.add_layer("Reduce", [y], {"op": "mean", "axes": [1, 2]}).outputs[0]
        net.mark_output(net.add_layer("Softmax", [s], {"axis": -1}).outputs[0], name="y0")
        net.mark_output(net.add_layer("Identity", [s], {"dtype": "float32"}).outputs[0], name="y1")
        return net

    compare(build, normal((2, 6, 6, 8), dtype="float16"))


def _bools(*shapes):
    def make(rng):
        return {f"x{i}": rng.uniform(size=s) > 0.5 for i, s in enumerate(shapes)}

    return make


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_elementwise_arithmetic_of_bools(op):
    """numpy's sum of bools is or, prod is and (ONNX's Add and Mul take no bools)."""
    compare(single("ElementWise", [("bool", (3, 4)), ("bool", (4,))], {"op": op}), _bools((3, 4), (4,)))


def test_select_of_bools():
    compare(single("Select", [("bool", (3, 4)), ("bool", (3, 4)), ("bool", (1, 4))], {}),
            _bools((3, 4), (3, 4), (1, 4)))


@pytest.mark.parametrize("op", layer_ops.REDUCE_OPS)
def test_reduce_over_no_axes(op):
    """No axes reduce nothing (ONNX's reductions would reduce every axis)."""
    compare(single("Reduce", [("float32", (2, 3))], {"op": op, "axes": []}), normal((2, 3), low=0.5, high=2.0))


def test_scalar_constant_output():
    from tftrt_py.engine import Network

    def build():
        net = Network("scalar")
        x = net.add_input("x0", "float32", (2, 3))
        total = net.add_layer("Reduce", [x], {"op": "sum", "axes": [0, 1]}).outputs[0]
        net.mark_output(net.add_layer("ElementWise", [total, net.add_constant(np.float32(0.5))],
                                      {"op": "prod"}).outputs[0], name="y0")
        net.mark_output(net.add_constant(np.float32(2.5)), name="y1")
        return net

    compare(build, normal((2, 3)))


def test_int8_convolution_residual_and_activation():
    shape = (2, 8, 8, 16)
    params = _GPU.conv_params(act={"type": "swish"})
    weights = {"kernel": _GPU.kernel(3, 3, 16, 16), "bias": _GPU.rng0.standard_normal(16).astype(np.float32)}
    build = single("Convolution", [("float32", shape), ("float32", shape)], params, weights)
    compare(_with_ranges(build, [3.0, None]), normal(shape, shape, low=-3.0, high=3.0), "INT8")


@pytest.mark.parametrize("act, fused", [("gelu_tanh", "FastGelu"), ("gelu_erf", "BiasGelu")])
def test_bias_and_gelu_run_as_one_kernel(act, fused):
    """A bias then GELU (a BERT FFN's first matrix multiply) as ONNX Runtime's fused bias-GELU kernel."""
    weights = {"w0": _GPU.kernel(32, 64), "b0": _GPU.rng0.standard_normal(64).astype(np.float32),
               "w1": _GPU.kernel(64, 16), "b1": _GPU.rng0.standard_normal(16).astype(np.float32)}
    params = {"activations": [{"type": act}, None]}
    engine = compare(single("MLP", [("float32", (8, 32))], params, weights), normal((8, 32)))
    ops = [n.op_type for n in prune(lower(engine.network)).graph.node]
    assert ops.count(fused) == 1 and "Gelu" not in ops


@pytest.mark.parametrize("half_pixel, coordinates", [(True, "half_pixel"), (False, "asymmetric")])
def test_bilinear_resize_of_finite_inputs_is_one_resize_and_of_others_tensorflows_lerps(half_pixel, coordinates):
    """Finite inputs take ONNX Runtime's Resize (one pass over the output, within TF's tolerance); inputs holding
    NaN or an infinity take TF's own gathers and lerps, which decide where an infinite neighbour gives NaN
    (tests/engine/gpu/test_nan_inf.py holds the values)."""
    params = {"mode": "linear", "sizes": [24, 20], "align_corners": False, "half_pixel_centers": half_pixel}
    engine = compare(single("Resize", [("float32", (2, 7, 5, 3))], params), normal((2, 7, 5, 3)))
    (branching,) = [n for n in prune(lower(engine.network)).graph.node if n.op_type == "If"]
    branches = {a.name: [n for n in a.g.node] for a in branching.attribute}
    (resize,) = branches["else_branch"]
    assert resize.op_type == "Resize" and {a.name: a.s.decode() for a in resize.attribute if a.s} == {
        "mode": "linear", "coordinate_transformation_mode": coordinates}
    assert "Resize" not in [n.op_type for n in branches["then_branch"]]


def test_bilinear_resize_with_aligned_corners_is_tensorflows_lerps():
    """ONNX Runtime's align_corners coordinates lie up to 3e-5 from TF's: TF's gathers and lerps instead."""
    params = {"mode": "linear", "sizes": [24, 20], "align_corners": True, "half_pixel_centers": False}
    engine = compare(single("Resize", [("float32", (2, 7, 5, 3))], params), normal((2, 7, 5, 3)))
    assert not {"If", "Resize"} & {n.op_type for n in prune(lower(engine.network)).graph.node}


@pytest.mark.parametrize("shape, window, strides, pre, post", [
    ((2, 9, 9, 8), [3, 3], [2, 2], [1, 1], [1, 1]), ((2, 8, 7, 4), [3, 2], [2, 1], [0, 1], [2, 0]),
    ((2, 15, 4), [3], [2], [1], [2]), ((1, 5, 6, 6, 4), [2, 3, 2], [2, 2, 1], [1, 0, 1], [0, 2, 1])])
def test_max_pooling_over_zeros_padded_in_pads_nothing(shape, window, strides, pre, post):
    """count_include_pad max pooling: a window reaching into the padding is never below 0 (all inputs here are
    negative), and the lowering makes no padded copy of its input (tests/engine/gpu/test_nan_inf.py: NaN and Inf)."""
    params = dict(type="max", window=window, strides=strides, pre_padding=pre, post_padding=post,
                  count_include_pad=True)
    engine = compare(single("Pooling", [("float32", shape)], params), normal(shape, low=-2.0, high=-0.5))
    assert "Pad" not in {n.op_type for n in prune(lower(engine.network)).graph.node}


def test_max_pooling_of_finite_inputs_is_one_max_pool_and_of_others_skips_nan():
    """Inputs holding NaN or an infinity take the pooling that reads NaN as -Inf (tests/engine/gpu/test_nan_inf.py
    holds the values); finite inputs take ONNX Runtime's MaxPool alone."""
    params = dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1], post_padding=[1, 1])
    engine = compare(single("Pooling", [("float32", (2, 9, 9, 8))], params), normal((2, 9, 9, 8)))
    (branching,) = [n for n in prune(lower(engine.network)).graph.node if n.op_type == "If"]
    branches = {a.name: [n.op_type for n in a.g.node] for a in branching.attribute}
    assert branches["else_branch"] == ["MaxPool"] and "Where" in branches["then_branch"]
