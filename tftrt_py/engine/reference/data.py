"""Reference kernels of data-movement kinds: constants, casts, shuffles, slices, gathers, top-k, NMS, resize."""
from __future__ import annotations

import numpy as np

from tftrt_py.engine.reference.registry import kernel

__all__ = ["slice_stop", "nearest_index", "linear_weights"]


@kernel("Constant")
def _constant(layer, inputs):
    return [layer.weights["value"]]


@kernel("Identity")
def _identity(layer, inputs):
    return [inputs[0].astype(layer.outputs[0].dtype, copy=False)]


@kernel("Bitcast")
def _bitcast(layer, inputs):
    return [np.ascontiguousarray(inputs[0]).view(layer.outputs[0].dtype)]


@kernel("Shuffle")
def _shuffle(layer, inputs):
    x = inputs[0]
    p = layer.params
    if p.get("first_perm") is not None:
        x = np.transpose(x, p["first_perm"])
    if p.get("reshape") is not None:
        x = x.reshape(layer.outputs[0].shape if p.get("second_perm") is None else p["reshape"])
    if p.get("second_perm") is not None:
        x = np.transpose(x, p["second_perm"])
    return [np.asarray(x, order="C")]


@kernel("Padding")
def _padding(layer, inputs):
    p = layer.params
    pads = list(zip(p["pre"], p["post"]))
    mode = p.get("mode", "constant")
    if mode == "constant":
        return [np.pad(inputs[0], pads, constant_values=p.get("value", 0))]
    return [np.pad(inputs[0], pads, mode=mode)]


@kernel("Concatenation")
def _concat(layer, inputs):
    return [np.concatenate(inputs, axis=layer.params["axis"])]


@kernel("Slice")
def _slice(layer, inputs):
    p = layer.params
    index = tuple(slice(s, slice_stop(s, n, st), st) for s, n, st in zip(p["start"], p["size"], p["stride"]))
    return [np.asarray(inputs[0][index], order="C")]


def slice_stop(start, size, stride):
    """The exclusive stop of `size` elements from `start` by `stride` (None: past index 0 going down)."""
    if not size:
        return start
    stop = start + (size - 1) * stride + (1 if stride > 0 else -1)
    return None if stop < 0 else stop


@kernel("Gather")
def _gather(layer, inputs):
    return [np.take(inputs[0], inputs[1], axis=layer.params["axis"])]


@kernel("TopK")
def _topk(layer, inputs):
    x = inputs[0]
    axis, k = layer.params["axis"], layer.params["k"]
    order = np.argsort(-x, axis=axis, kind="stable")  # stable: ties keep the lower index first
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)]


def _iou(boxes):
    """Pairwise IoU of [M, 4] boxes in float32, corners in either order (as TF computes it)."""
    b = boxes.astype(np.float32)
    lo, hi = np.minimum(b[:, :2], b[:, 2:]), np.maximum(b[:, :2], b[:, 2:])
    area = (hi[:, 0] - lo[:, 0]) * (hi[:, 1] - lo[:, 1])
    inter = np.prod(np.maximum(np.minimum(hi[:, None], hi[None]) - np.maximum(lo[:, None], lo[None]),
                               np.float32(0)), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (area[:, None] + area[None] - inter)
    return np.where((area[:, None] <= 0) | (area[None] <= 0), np.float32(0), iou)


def _nms_class(boxes, scores, limit, iou_threshold, score_threshold):
    """Greedy NMS of one class: selected box indices, best score first."""
    idx = np.flatnonzero(scores > score_threshold)
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    iou = _iou(boxes[idx])
    keep = []
    for i in range(len(idx)):
        if len(keep) == limit:
            break
        if not keep or not (iou[i, keep] > iou_threshold).any():
            keep.append(i)
    return idx[keep]


@kernel("NMS")
def _nms(layer, inputs):
    """TF's CombinedNonMaxSuppression: per-class NMS, merged by score, clipped and zero-padded."""
    boxes, scores = inputs
    p = layer.params
    b, n, q, _ = boxes.shape
    out_boxes, out_scores, out_classes, valid = (np.zeros(t.shape, t.dtype) for t in layer.outputs)
    limit, d = min(p["max_output_size_per_class"], n), out_scores.shape[1]
    iou_t, score_t = np.float32(p["iou_threshold"]), np.float32(p["score_threshold"])
    for row in range(b):
        found = []  # (score, class, box index), class-major then selection order
        for c in range(scores.shape[2]):
            cls_boxes, cls_scores = boxes[row, :, c if q > 1 else 0], scores[row, :, c].astype(np.float32)
            found += [(cls_scores[i], c, i) for i in _nms_class(cls_boxes, cls_scores, limit, iou_t, score_t)]
        found.sort(key=lambda r: -r[0])
        found = found[:d]
        valid[row] = len(found)
        for j, (score, c, i) in enumerate(found):
            box = boxes[row, i, c if q > 1 else 0]
            out_boxes[row, j] = np.clip(box, 0, 1) if p.get("clip_boxes", True) else box
            out_scores[row, j], out_classes[row, j] = score, c
    return [out_boxes, out_scores, out_classes, valid]


def _resize_scale(in_size, out_size, align_corners):
    """TF's CalculateResizeScale, in float32."""
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def nearest_index(in_size, out_size, align_corners, half_pixel):
    """Source index of each output row, as TF's ResizeNearestNeighbor computes it (float32)."""
    scale = _resize_scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + np.float32(0.5)) * scale if half_pixel else pos * scale
    src = src.astype(np.float64)  # exact; roundf rounds halves away from zero and src >= 0
    idx = np.floor(src + 0.5) if align_corners else np.floor(src)
    return np.clip(idx.astype(np.int64), 0, in_size - 1)


def linear_weights(in_size, out_size, align_corners, half_pixel):
    """(lower, upper, lerp) per output row, as TF's ResizeBilinear computes them (float32)."""
    scale = _resize_scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else pos * scale
    low = np.floor(src)
    lower = np.maximum(low.astype(np.int64), 0)
    upper = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    return lower, upper, (src - low).astype(np.float32)


@kernel("Resize")
def _resize(layer, inputs):
    x = inputs[0]
    p = layer.params
    (h, w), (oh, ow) = x.shape[1:3], p["sizes"]
    args = (p.get("align_corners", False), p.get("half_pixel_centers", False))
    if p["mode"] == "nearest":
        return [np.ascontiguousarray(x[:, nearest_index(h, oh, *args)][:, :, nearest_index(w, ow, *args)])]
    x = x.astype(np.float32)
    y0, y1, ylerp = linear_weights(h, oh, *args)
    x0, x1, xlerp = linear_weights(w, ow, *args)
    xlerp = xlerp[None, None, :, None]
    top_rows, bottom_rows = x[:, y0], x[:, y1]
    top = top_rows[:, :, x0] + (top_rows[:, :, x1] - top_rows[:, :, x0]) * xlerp
    bottom = bottom_rows[:, :, x0] + (bottom_rows[:, :, x1] - bottom_rows[:, :, x0]) * xlerp
    return [(top + (bottom - top) * ylerp[None, :, None, None]).astype(np.float32)]
