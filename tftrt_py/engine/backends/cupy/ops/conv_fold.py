"""Convolutions of few channels and stride 2 (a CNN's stem on an RGB image) run folded: each block of two input
pixels along an axis becomes one pixel of twice the channels (space to depth), the stride along that axis becomes
1 and the filter taps regroup to match, so a filter tap reads several pixels' contiguous bytes where it read one
pixel's 4. Folding both axes (2x2 blocks: the quantize step writes the folded image, ops/quant.FOLDED) makes the
7x7/2 stem of ResNet-50 a 4x4/1 convolution of 16 channels, 16 bytes a tap; folding W alone needs no other layout
(each pair of neighbours is already 8 contiguous bytes of the image).

A folded filter holds zero weights where a block reaches past the filter's window (an odd kernel, or odd padding
before it): exact for int8 operands, but an E4M3 or fp16 NaN (or Inf) times a zero weight is NaN, which would reach
outputs whose window does not hold it; so only INT8 convolutions fold.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

import numpy as np

from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom

__all__ = ["BOTH", "WIDTH", "foldable", "fold", "fold_weights", "folded_shape", "unfolded_shape"]

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
