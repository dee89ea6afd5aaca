"""ResizeBilinear and ResizeNearestNeighbor match TensorFlow for every coordinate rule, up and down."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import support
from reasons import check
from specials import mismatch
from support import assert_converts, random_array
from tftrt_py.engine.builder import BuilderConfig

RULES = {"legacy": (False, False), "align_corners": (True, False), "half_pixel_centers": (False, True)}
SIZES = [(5, 7), (2, 3), (8, 8), (1, 1), (4, 9)]


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("batch", [1, 2])
def test_bilinear(rule, size, batch):
    align, half = RULES[rule]
    fn = lambda t: tf.raw_ops.ResizeBilinear(images=t, size=size, align_corners=align, half_pixel_centers=half)
    assert_converts(fn, [random_array((batch, 4, 6, 3))], expect_kinds=["Resize"])


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("size", SIZES + [(12, 18), (3, 5)])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_nearest_neighbor(rule, size, dtype):
    align, half = RULES[rule]
    fn = lambda t: tf.raw_ops.ResizeNearestNeighbor(images=t, size=size, align_corners=align,
                                                     half_pixel_centers=half)
    assert_converts(fn, [random_array((2, 4, 6, 3), dtype)], expect_kinds=["Resize"])


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_tf_image_resize_to_twice_the_input(method):
    """tf.image.resize (half-pixel centers) to a size computed from tf.shape, as decoders upsample."""
    fn = lambda t: tf.image.resize(t, tf.shape(t)[1:3] * 2, method=method)
    assert_converts(fn, [random_array((1, 5, 3, 2))], expect_kinds=["Resize"])


def test_bilinear_of_int32_gives_float32():
    fn = lambda t: tf.raw_ops.ResizeBilinear(images=t, size=[5, 5])
    assert_converts(fn, [random_array((1, 3, 3, 2), "int32")], expect_kinds=["Resize"])


def test_sizes_that_are_not_whole_scales():
    """Scales such as 7/3 put source coordinates near integers, where float32 rounding decides."""
    for size in [(7, 7), (10, 13), (29, 31)]:
        for align, half in RULES.values():
            for op in (tf.raw_ops.ResizeBilinear, tf.raw_ops.ResizeNearestNeighbor):
                fn = lambda t: op(images=t, size=size, align_corners=align, half_pixel_centers=half)
                assert_converts(fn, [random_array((1, 3, 11, 1))])


def test_both_rules_at_once_are_refused():
    fn = lambda t: tf.raw_ops.ResizeBilinear(images=t, size=[4, 4], align_corners=True, half_pixel_centers=True)
    assert "both" in check(fn, [tf.TensorSpec((1, 2, 2, 1))], "ResizeBilinear")


def test_unknown_rank_is_refused():
    fn = lambda t: tf.raw_ops.ResizeBilinear(images=t, size=[4, 4])
    assert "unknown rank" in check(fn, [tf.TensorSpec(None)], "ResizeBilinear")


def test_run_time_size_is_refused():
    fn = lambda t, s: tf.raw_ops.ResizeNearestNeighbor(images=t, size=s)
    assert "known when building" in check(fn, [tf.TensorSpec((1, 2, 2, 1)), tf.TensorSpec((2,), tf.int32)],
                                          "ResizeNearestNeighbor")


def test_values_are_exactly_tfs_for_nearest():
    x = np.arange(1, 1 + 2 * 5 * 4 * 1, dtype=np.float32).reshape(2, 5, 4, 1)
    assert_converts(lambda t: tf.raw_ops.ResizeNearestNeighbor(images=t, size=[9, 3], half_pixel_centers=True),
                    [x], rtol=0, atol=0)


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_a_projection_of_upsampled_values_runs_first_and_matches_tf_with_nan_and_inf(method, backend, monkeypatch):
    """Resize -> 1x1 Conv2D (a segmentation head's logits): the engine projects first, at the input's resolution,
    and gives TF's values, its NaN and its infinities of either sign (a few non-finite pixels, the rest finite)."""
    if backend == "onnxruntime":
        pytest.importorskip("onnxruntime")
        monkeypatch.setattr(support, "BuilderConfig", functools.partial(BuilderConfig, backend=backend))
    rng = np.random.default_rng(5)
    kernel, bias = random_array((1, 1, 6, 2)), random_array((2,))
    fn = lambda t: tf.nn.bias_add(tf.nn.conv2d(tf.image.resize(t, [13, 17], method), kernel, 1, "VALID"), bias)
    x = random_array((2, 5, 6, 6))
    for value in (np.inf, -np.inf, np.nan, np.inf, -np.inf):
        x[tuple(rng.integers(0, n) for n in x.shape)] = value
    engine, (got,) = support.run_engine(fn, [x])
    assert [l.kind for l in engine.network.layers if l.kind != "Constant"] == ["Convolution", "Resize"]
    want = fn(tf.constant(x)).numpy()
    assert np.isfinite(want).any() and not np.isfinite(want).all()
    assert mismatch(got, want, 1e-5) is None, mismatch(got, want, 1e-5)
