"""Stride-2 convolutions of an RGB image run folded (cupy backend's ops/conv_fold.py), without a GPU: each 2x2 block
(or pair along W) of pixels one pixel of four (two) times the channels, the filter regrouped to match, gives the
same sums; what does not fold keeps its geometry; an INT8 or FP8 stem on an engine input reads its image folded."""
import dataclasses

import numpy as np
import pytest

from tftrt_py.engine import Network
from tftrt_py.engine.backends.cupy.ops import conv_fold
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom
from tftrt_py.engine.backends.cupy.ops.quant import FOLDED, ROWS, quantized_shape
from tftrt_py.engine.backends.cupy.quant_planning import quant_plan
from tftrt_py.engine.reference import conv_sums


def sums(x, w, geom):
    """The reference convolution sums of NHWC x with filters [COUT, KH, KW, C] in `geom`'s strides and padding."""
    params = dict(strides=geom.strides, dilations=(1, 1), pre_padding=geom.pre, post_padding=geom.post, groups=1)
    return conv_sums(x.astype(np.float64), np.moveaxis(w, 0, -1).astype(np.float64), params)


def stem(kernel, pre, post, height=12, width=20):
    out = tuple((size + pre + post - kernel) // 2 + 1 for size in (height, width))
    return ConvGeom(2, (height, width), 4, 5, (kernel, kernel), 1, (2, 2), (1, 1), (pre, pre), (post, post), out)


def fold_image(x, blocks):
    """x [N, H, W, C] as its folded image: the channels of a block ordered (row in it, column in it, channel)."""
    n, h, w, c = x.shape
    bh, bw = blocks
    return x.reshape(n, h // bh, bh, w // bw, bw, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, h // bh, w // bw,
                                                                                           bh * bw * c)


@pytest.mark.parametrize("blocks", [conv_fold.BOTH, conv_fold.WIDTH])
@pytest.mark.parametrize("kernel, pre, post, width", [(7, 3, 3, 20), (7, 2, 3, 20), (7, 2, 2, 20), (5, 2, 2, 14),
                                                      (3, 1, 1, 8), (3, 0, 1, 16), (7, 0, 0, 22)])
def test_a_folded_stride_2_image_of_4_channels_gives_the_same_sums(blocks, kernel, pre, post, width):
    rng = np.random.default_rng(kernel * 100 + pre * 10 + post)
    geom = stem(kernel, pre, post, width=width)
    assert conv_fold.foldable(geom, blocks)
    folded = conv_fold.fold(geom, blocks)
    c = 4 * blocks[0] * blocks[1]
    assert folded.c == c and folded.out == geom.out
    assert folded.strides == tuple(1 if b == 2 else 2 for b in blocks)
    x = rng.integers(-127, 128, (2, 12, width, 4), dtype=np.int8)
    w = rng.integers(-127, 128, (5, kernel, kernel, 4), dtype=np.int8)
    expected = sums(x, w, geom)
    assert expected.shape == (2, *geom.out, 5)
    np.testing.assert_array_equal(sums(fold_image(x, blocks), conv_fold.fold_weights(w, geom, blocks), folded),
                                  expected)


def test_the_7x7_stem_of_resnet50_becomes_a_4x4_convolution_of_16_channels_and_stride_1():
    folded = conv_fold.fold(stem(7, 3, 3, 224, 224))
    assert (folded.spatial, folded.c, folded.kernel, folded.strides, folded.pre, folded.post, folded.out) == (
        (112, 112), 16, (4, 4), (1, 1), (2, 2), (1, 1), (112, 112))
    assert conv_fold.folded_shape((8, 224, 224, 4)) == (8, 112, 112, 16)
    assert conv_fold.unfolded_shape((8, 112, 112, 16)) == (8, 224, 224, 4)
    assert quantized_shape((8, 224, 224, 3), 4, FOLDED) == (8, 112, 112, 16)


@pytest.mark.parametrize("change", [dict(c=8), dict(strides=(1, 1)), dict(spatial=(13, 20)), dict(groups=2),
                                    dict(dilations=(2, 2)), dict(pre=(-1, -1))])
def test_other_convolutions_do_not_fold(change):
    geom = stem(3, 1, 1)
    assert conv_fold.foldable(geom)
    assert not conv_fold.foldable(dataclasses.replace(geom, **change))


def stem_layer(net, x, name="stem", cout=8):
    params = dict(strides=[2, 2], dilations=[1, 1], pre_padding=[3, 3], post_padding=[3, 3], groups=1)
    kernel = np.random.default_rng(0).standard_normal((7, 7, x.shape[-1], cout)).astype(np.float32)
    return net.add_layer("Convolution", [x], params, {"kernel": kernel}, name=name)


def image_net(channels=3):
    net = Network("stem")
    x = net.add_input("x", "float32", (2, 32, 32, channels))
    x.dynamic_range = 2.0
    first = stem_layer(net, x, cout=3)  # an image of 16x16 pixels, 3 channels, which a layer writes
    first.outputs[0].dynamic_range = 2.0
    return net, first, stem_layer(net, first.outputs[0], name="second")


@pytest.mark.parametrize("fmt", ["INT8", "FP8"])
def test_a_quantized_stem_on_an_engine_input_reads_it_folded_and_others_read_rows(fmt):
    net, first, second = image_net()
    operands, quant = quant_plan(first, fmt)
    assert [o[3] for o in operands] == [FOLDED] and quant["folded"]
    operands, quant = quant_plan(second, fmt)  # a layer's output is not an image
    assert [o[3] for o in operands] == [ROWS] and not quant["folded"]


def test_an_fp8_stem_folds_only_an_image_with_a_padding_byte_for_its_nan_flags():
    """E4M3 NaN times a folded filter's zero weight is NaN: NaN pixels are flagged in each pixel's padding byte
    instead, which an image of 4 channels does not have. int8 holds no NaN, so its stem folds either way."""
    first = image_net(channels=4)[1]
    assert quant_plan(first, "INT8")[1]["folded"]
    operands, quant = quant_plan(first, "FP8")
    assert [o[3] for o in operands] == [ROWS] and not quant["folded"]
