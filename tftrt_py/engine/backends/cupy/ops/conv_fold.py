"""Convolutions of few channels and stride 2 (a CNN's stem on an RGB image) run folded: each block of two input
pixels along an axis becomes one pixel of twice the channels (space to depth), the stride along that axis becomes
1 and the filter taps regroup to match, so a filter tap reads several pixels' contiguous bytes where it read one
pixel's 4. Folding both axes (2x2 blocks: the quantize step writes the folded image, ops/quant.FOLDED) makes the
7x7/2 stem of ResNet-50 a 4x4/1 convolution of 16 channels, 16 bytes a tap; folding W alone needs no other layout
(each pair of neighbours is already 8 contiguous bytes of the image).

A folded filter holds zero weights where a block reaches past the filter's window (an odd kernel, or odd padding
before it): exact for int8 operands (which hold no NaN), but an E4M3 NaN times a zero weight is NaN, which would
reach outputs whose window does not hold it. So an FP8 stem folds only an image of fewer than 4 channels: its
quantize step writes each pixel holding NaN as zeros with a flag in the pixel's padding byte (whose weights are
zero), the convolution runs folded on finite values, and a step after it (:class:`NanWindowsOp`) writes NaN into
the outputs whose windows hold a flagged pixel, as the convolution unfolded computes them (ResNet-50's FP8 stem at
batch 128 on an H200: 0.147 ms folded, the NaN-window step's 7 us included, against 0.226 unfolded; that step takes
45 us where 1% of the pixels are NaN, 1.1 ms where all are). fp16 operands do not fold.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import kernels
from tftrt_py.engine.backends.cupy.ops.base import FollowedOp, Op, Spec
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom

__all__ = ["BOTH", "WIDTH", "foldable", "fold", "fold_weights", "folded_shape", "unfolded_shape", "network_geom",
           "NAN_PIXEL", "NanWindowsOp"]

#: Blocks folded along (H, W): both axes (the quantize step writes the folded layout), or W alone (a view).
BOTH, WIDTH = (2, 2), (1, 2)


def _axis(kernel: int, pre: int, size: int, out: int) -> Tuple[int, int, int]:
    """(taps, padding before, padding after) of one axis folded by 2: filter tap k lands on half-tap k + pre % 2,
    so ceil((kernel + pre % 2) / 2) taps cover it, and the padding before becomes ceil(pre / 2)."""
    taps, before = (kernel + pre % 2 + 1) // 2, (pre + 1) // 2
    return taps, before, out - 1 + taps - size // 2 - before


def fold(geom: ConvGeom, blocks: Tuple[int, int] = BOTH) -> ConvGeom:
    """The geometry of `geom` (2-d, stride 2 along each folded axis, even sizes there) folded by `blocks`."""
    kernel, pre, post = list(geom.kernel), list(geom.pre), list(geom.post)
    for axis, block in enumerate(blocks):
        if block == 2:
            kernel[axis], pre[axis], post[axis] = _axis(geom.kernel[axis], geom.pre[axis], geom.spatial[axis],
                                                        geom.out[axis])
    return dataclasses.replace(geom, spatial=tuple(s // b for s, b in zip(geom.spatial, blocks)),
                               c=geom.c * blocks[0] * blocks[1], kernel=tuple(kernel),
                               strides=tuple(1 if b == 2 else s for s, b in zip(geom.strides, blocks)),
                               pre=tuple(pre), post=tuple(post))


def foldable(geom: ConvGeom, blocks: Tuple[int, int] = BOTH) -> bool:
    """Whether `geom` folds by `blocks`: 2-d, ungrouped, undilated, 4 channels (an RGB image padded to 4), padding
    of zero or more (after folding too), stride 2 and an even size along each folded axis."""
    if not (len(geom.spatial) == 2 and geom.groups == 1 and geom.dilations == (1, 1) and geom.c == 4
            and min(geom.pre + geom.post) >= 0):
        return False
    if any(b == 2 and (s != 2 or size % 2) for b, s, size in zip(blocks, geom.strides, geom.spatial)):
        return False
    return min(fold(geom, blocks).post) >= 0


def fold_weights(w: np.ndarray, geom: ConvGeom, blocks: Tuple[int, int] = BOTH) -> np.ndarray:
    """Filters [COUT, KH, KW, C] of `geom` as those of its folded geometry [COUT, KH', KW', C'], the channels of a
    folded pixel ordered (row in the block, column in the block, channel), as the folded image holds them."""
    folded = fold(geom, blocks)
    cout, kh, kw, c = w.shape
    shift = [p % 2 if b == 2 else 0 for p, b in zip(geom.pre, blocks)]
    out = np.zeros((cout, blocks[0] * folded.kernel[0], blocks[1] * folded.kernel[1], c), w.dtype)
    out[:, shift[0]:shift[0] + kh, shift[1]:shift[1] + kw] = w
    out = out.reshape(cout, folded.kernel[0], blocks[0], folded.kernel[1], blocks[1], c).transpose(0, 1, 3, 2, 4, 5)
    return np.ascontiguousarray(out.reshape(cout, *folded.kernel, folded.c))


def folded_shape(shape) -> Tuple[int, ...]:
    """The shape of an NHWC image folded by 2x2 blocks."""
    n, h, w, c = shape
    return n, h // 2, w // 2, 4 * c


def unfolded_shape(shape) -> Tuple[int, ...]:
    """The NHWC shape a 2x2-folded image of `shape` was folded from."""
    n, h, w, c = shape
    return n, 2 * h, 2 * w, c // 4


def network_geom(spec: Spec) -> ConvGeom:
    """The geometry of a quantized convolution as the network holds it (c: the padded channel count), whether its
    plan reads the input folded by 2x2 pixel blocks (``quant["folded"]``) or not."""
    x = spec.in_shapes[0]
    return ConvGeom.of(spec.layer, unfolded_shape(x) if spec.quant.get("folded") else x, spec.out_shapes[0])


#: The word a folded E4M3 image holds for a pixel holding NaN (the quantize step's ``flag_nan``): its three channels
#: 0, its padding byte E4M3 1.0, which the convolution multiplies by a zero weight. A pixel quantized from finite
#: values has padding 0, so no other pixel is this word.
NAN_PIXEL = 0x38000000
#: The storage type of each dtype a folded convolution writes (E4M3 bytes are stored as uint8), and a 32-bit word of
#: its NaN values.
_NAN_WORDS = {"uint8": ("unsigned char", "0x7f7f7f7fu"), "float16": ("unsigned short", "0x7e007e00u"),
              "float32": ("unsigned int", "0x7fc00000u")}
_NAN_WINDOWS = kernels.source("nan_windows.cu")


class NanWindowsOp(FollowedOp):
    """A convolution run on an E4M3 image folded with its NaN pixels flagged (the quantize step's ``flag_nan``),
    then NaN written into every channel of each output whose window holds a flagged pixel (cuda/nan_windows.cu).
    `geom`: the convolution unfolded; `out_dtypes`: its outputs' (a float output and a quantized copy where it
    writes both)."""

    def __init__(self, inner: Op, geom: ConvGeom, out_dtypes):
        super().__init__(inner)
        (h, w), (kh, kw), (sh, sw), (ph, pw), (oh, ow) = geom.spatial, geom.kernel, geom.strides, geom.pre, geom.out
        (out_t, out_nan), (q_t, q_nan) = _NAN_WORDS[out_dtypes[0]], _NAN_WORDS[out_dtypes[-1]]
        defs = dict(NAN_PIXEL=hex(NAN_PIXEL), H2=h // 2, W2=w // 2, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, OH=oh,
                    OW=ow, COUT=geom.cout, OUT_T=out_t, OUT_NAN4=out_nan, Q_T=q_t, Q_NAN4=q_nan,
                    DUAL=int(len(out_dtypes) > 1))
        head = "".join(f"#define {name} {value}\n" for name, value in defs.items())
        self.kernel = kernels.raw_kernel(head + _NAN_WINDOWS, "tt_nan_windows")
        self.pixels = geom.n * (h // 2) * (w // 2)
        self.tactic = dict(inner.tactic, nan_windows=True)

    def run(self, rc, ins, outs):
        self.inner.run(rc, ins, outs)
        kernels.launch(self.kernel, self.pixels, (ins[0], outs[0], outs[-1], kernels.i64(self.pixels)))
