"""Layer kinds: the few, general operations an engine is made of.

Each kind registers a spec with the schema of its params (see :mod:`params`) and rules that do not
depend on any backend:
``infer(layer) -> [(dtype, shape), ...]``; ``rowwise(layer, batched) -> bool``, which
says whether output row i depends only on row i of the batched inputs (so an engine
built for batch B can serve a smaller batch); and its costs ``work`` and ``scratch`` (see :mod:`layer_costs`).
The ops and modes params may name are in :mod:`layer_ops`; shape arithmetic the kinds share with kernels is in
:mod:`layer_geometry`. Backends implement kinds, not TF ops.
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

from tftrt_py.engine import layer_costs
from tftrt_py.engine.errors import NetworkError
from tftrt_py.engine.layer_geometry import (attention_columns, attention_scores_shape, broadcast_shape,
                                            conv_output_size, nms_detections, shuffle_shapes)
from tftrt_py.engine.layer_ops import (ACTIVATIONS, COMPARISONS, ELEMENTWISE_OPS, PADDING_MODES, REDUCE_OPS,
                                       RESIZE_MODES, UNARY_OPS)
from tftrt_py.engine.params import (RANK, SPATIAL, axes, axis, boolean, integer, ints, list_of, number, one_of,
                                    optional, permutation, record)
from tftrt_py.engine.types import DTYPES

__all__ = ["register", "get", "kinds"]

Info = Tuple[str, Tuple[int, ...]]


class KindSpec:
    def __init__(self, kind: str, infer: Callable, rowwise: Callable, params: dict, work: Callable,
                 scratch: Callable):
        self.kind, self.infer, self.rowwise, self.params = kind, infer, rowwise, params
        self.work, self.scratch = work, scratch


_SPECS: Dict[str, KindSpec] = {}


def register(kind: str, rowwise: Callable = None, params: dict = None, work: Callable = None,
             scratch: Callable = None):
    """Decorator registering the shape rule of a layer kind, the schema of its `params` ({name: spec}, see
    :mod:`params`) and optionally its batch rule, its work (default: :func:`layer_costs.elements`) and its
    scratch bytes (default: none)."""

    def wrap(infer):
        if kind in _SPECS:
            raise ValueError(f"layer kind {kind!r} registered twice")
        _SPECS[kind] = KindSpec(kind, infer, rowwise or _rowwise_default, params or {}, work or layer_costs.elements,
                                scratch or layer_costs.no_scratch)
        return infer

    return wrap


def get(kind: str) -> KindSpec:
    try:
        return _SPECS[kind]
    except KeyError:
        raise NetworkError(f"unknown layer kind {kind!r} (known: {', '.join(sorted(_SPECS))})") from None


def kinds() -> List[str]:
    return sorted(_SPECS)


# -- param schemas shared by several kinds --------------------------------------
_ACTIVATION_PARAMS = dict(type=one_of(*ACTIVATIONS), alpha=optional(number()), beta=optional(number()))
ACTIVATION = record(**_ACTIVATION_PARAMS)
_WINDOW = dict(strides=ints(SPATIAL, 1), pre_padding=ints(SPATIAL, 0), post_padding=ints(SPATIAL, 0))


# -- helpers ------------------------------------------------------------------
def _same_as_input(layer) -> List[Info]:
    t = layer.inputs[0]
    return [(t.dtype, t.shape)]


def _rowwise_default(layer, batched: Sequence[bool]) -> bool:
    """Shape-preserving kinds are row-wise when every batched operand has the output's rank (a lower one
    would broadcast its rows into other axes) and every unbatched operand broadcasts over axis 0."""
    out_rank = layer.outputs[0].rank
    for t, b in zip(layer.inputs, batched):
        if b and t.rank != out_rank:
            return False
        if not b and t.rank == out_rank and out_rank and t.shape[0] != 1:
            return False
    return True


def _axes(layer, key: str = "axes") -> List[int]:
    rank = layer.inputs[0].rank
    axes = [a + rank if a < 0 else a for a in layer.params[key]]
    if any(a < 0 or a >= rank for a in axes):
        raise NetworkError(f"axes {layer.params[key]} out of range for rank {rank}")
    return axes


# -- kinds --------------------------------------------------------------------
@register("Constant")
def _constant(layer):
    v = layer.weights["value"]
    return [(v.dtype.name, v.shape)]


@register("Identity", params=dict(dtype=optional(one_of(*DTYPES))))
def _identity(layer):
    t = layer.inputs[0]
    return [(layer.params.get("dtype", t.dtype), t.shape)]


def _conv_rowwise(layer, batched):
    return batched[0] and all(b or t.shape[0] == 1 for t, b in zip(layer.inputs[1:], batched[1:]))


@register("Convolution", rowwise=_conv_rowwise, work=layer_costs.conv_work, params=dict(
    _WINDOW, dilations=ints(SPATIAL, 1), groups=optional(integer(1)), activation=optional(ACTIVATION)))
def _convolution(layer):
    """Channels-last N-d convolution: x [N, *S, C], kernel [*K, C/groups, Cout] -> [N, *O, Cout].

    Optional: bias [Cout], a residual input (second input, the output's shape or a batch of 1 of
    it) added before the activation, and an ``activation`` dict (type, alpha, beta).
    """
    x = layer.inputs[0]
    k = layer.weights["kernel"]
    nsp = k.ndim - 2
    p = layer.params
    groups = p.get("groups", 1)
    if x.rank != nsp + 2:
        raise NetworkError(f"input rank {x.rank} does not match a {nsp}-d kernel")
    if x.shape[-1] != k.shape[-2] * groups:
        raise NetworkError(f"input channels {x.shape[-1]} != kernel in-channels {k.shape[-2]} x groups {groups}")
    out = [conv_output_size(x.shape[1 + i], k.shape[i], p["strides"][i], p["dilations"][i],
                            p["pre_padding"][i], p["post_padding"][i]) for i in range(nsp)]
    shape = (x.shape[0], *out, k.shape[-1])
    if len(layer.inputs) > 1 and layer.inputs[1].shape not in (shape, (1, *shape[1:])):
        raise NetworkError(f"residual shape {layer.inputs[1].shape} != convolution output {shape}")
    return [(x.dtype, shape)]


@register("Deconvolution", rowwise=_conv_rowwise, work=layer_costs.deconv_work, params=dict(
    strides=ints(SPATIAL, 1), pre_padding=ints(SPATIAL, 0), output_spatial=ints(SPATIAL, 1)))
def _deconvolution(layer):
    """Channels-last transposed convolution: kernel [*K, Cout, Cin]; params give the output spatial size."""
    x = layer.inputs[0]
    k = layer.weights["kernel"]
    if x.shape[-1] != k.shape[-1]:
        raise NetworkError(f"input channels {x.shape[-1]} != kernel in-channels {k.shape[-1]}")
    return [(x.dtype, (x.shape[0], *layer.params["output_spatial"], k.shape[-2]))]


def _matmul_rowwise(layer, batched):
    a, b = layer.inputs[:2]
    ba, bb = batched[:2]
    if any(t.rank != layer.outputs[0].rank for t, f in zip((a, b), (ba, bb)) if f):
        return False  # a batched operand broadcast over the other's leading axes
    if bb:
        # Both batched: row-wise only as a batched matmul over a leading batch axis.
        return ba and a.rank >= 3 and b.rank >= 3
    return ba and not layer.params.get("transpose_a") or (ba and a.rank >= 3)


@register("MatrixMultiply", rowwise=_matmul_rowwise, work=layer_costs.matmul_work, params=dict(
    transpose_a=optional(boolean), transpose_b=optional(boolean), activation=optional(ACTIVATION)))
def _matmul(layer):
    """np.matmul semantics with optional transposes of the last two axes; optional bias, a residual (third input,
    the output's shape) added before the optional activation."""
    if len(layer.inputs) not in (2, 3):
        raise NetworkError(f"MatrixMultiply takes a, b and at most a residual, got {len(layer.inputs)} inputs")
    a, b = layer.inputs[:2]
    if a.rank < 2 or b.rank < 2:
        raise NetworkError("MatrixMultiply needs operands of rank >= 2")
    sa, sb = list(a.shape), list(b.shape)
    if layer.params.get("transpose_a"):
        sa[-2], sa[-1] = sa[-1], sa[-2]
    if layer.params.get("transpose_b"):
        sb[-2], sb[-1] = sb[-1], sb[-2]
    if sa[-1] != sb[-2]:
        raise NetworkError(f"inner dims differ: {a.shape} x {b.shape}")
    shape = (*broadcast_shape(sa[:-2], sb[:-2]), sa[-2], sb[-1])
    _check_residual(layer, layer.inputs[2:], shape)
    return [(a.dtype, shape)]


def _check_residual(layer, residual, shape) -> None:
    """A GEMM's residual input (if any) has its output's shape and dtype."""
    if residual and (residual[0].shape != shape or residual[0].dtype != layer.inputs[0].dtype):
        raise NetworkError(f"{layer.kind} residual {residual[0].dtype} {list(residual[0].shape)} is not like its "
                           f"output ({layer.inputs[0].dtype} {list(shape)})")


@register("MLP", rowwise=lambda layer, batched: batched[0], work=layer_costs.mlp_work,
          params=dict(activations=list_of(optional(ACTIVATION), max_length=256)))
def _mlp(layer):
    """Fused 2-d matrix multiplies: x [M, K]; layer i computes x = activation_i(x @ w_i + b_i), with
    weights w_i [K_i, N_i], b_i [N_i] and ``activations`` (dict or None per layer); an optional residual
    (second input, the output's shape) is added in the last layer, before its activation."""
    x = layer.inputs[0]
    if x.rank != 2 or len(layer.inputs) > 2:
        raise NetworkError(f"MLP needs a 2-d input and at most a residual, got {[t.shape for t in layer.inputs]}")
    width = x.shape[1]
    for i in range(len(layer.params["activations"])):
        w, b = layer.weights[f"w{i}"], layer.weights[f"b{i}"]
        if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
            raise NetworkError(f"MLP layer {i}: weights {w.shape} and bias {b.shape} do not follow width {width}")
        width = w.shape[1]
    _check_residual(layer, layer.inputs[1:], (x.shape[0], width))
    return [(x.dtype, (x.shape[0], width))]


@register("ElementWise", params=dict(op=one_of(*ELEMENTWISE_OPS)))
def _elementwise(layer):
    op = layer.params["op"]
    if op not in ELEMENTWISE_OPS:
        raise NetworkError(f"unknown ElementWise op {op!r}")
    a, b = layer.inputs
    dtype = "bool" if op in COMPARISONS else a.dtype
    return [(dtype, broadcast_shape(a.shape, b.shape))]


@register("Select")
def _select(layer):
    c, a, b = layer.inputs
    return [(a.dtype, broadcast_shape(c.shape, a.shape, b.shape))]


@register("Unary", params=dict(op=one_of(*UNARY_OPS)))
def _unary(layer):
    if layer.params["op"] not in UNARY_OPS:
        raise NetworkError(f"unknown Unary op {layer.params['op']!r}")
    return _same_as_input(layer)


@register("Activation", params=_ACTIVATION_PARAMS)
def _activation(layer):
    if layer.params["type"] not in ACTIVATIONS:
        raise NetworkError(f"unknown activation {layer.params['type']!r}")
    return _same_as_input(layer)


@register("Scale", rowwise=lambda layer, batched: batched[0] and layer.params.get("channel_axis", -1) != 0,
          params=dict(channel_axis=optional(axis), activation=optional(ACTIVATION)))
def _scale(layer):
    """y = (x * scale + shift) ** power, each optional, per channel along ``channel_axis`` or uniform;
    then an optional ``activation`` dict (type, alpha, beta)."""
    x = layer.inputs[0]
    axis = layer.params.get("channel_axis", -1) % x.rank
    for key in ("scale", "shift", "power"):
        w = layer.weights.get(key)
        if w is not None and w.size not in (1, x.shape[axis]):
            raise NetworkError(f"Scale {key} has {w.size} values for {x.shape[axis]} channels")
    return _same_as_input(layer)


def _pool_rowwise(layer, batched):
    return batched[0]


@register("Pooling", rowwise=_pool_rowwise, work=layer_costs.pool_work, params=dict(
    _WINDOW, type=one_of("max", "avg"), window=ints(SPATIAL, 1), count_include_pad=optional(boolean)))
def _pooling(layer):
    """Channels-last max/average pooling over the spatial axes of [N, *S, C]."""
    x = layer.inputs[0]
    p = layer.params
    nsp = len(p["window"])
    if x.rank != nsp + 2:
        raise NetworkError(f"input rank {x.rank} does not match a {nsp}-d window")
    out = [conv_output_size(x.shape[1 + i], p["window"][i], p["strides"][i], 1, p["pre_padding"][i],
                            p["post_padding"][i]) for i in range(nsp)]
    return [(x.dtype, (x.shape[0], *out, x.shape[-1]))]


@register("Reduce", rowwise=lambda layer, batched: 0 not in _axes(layer)
          and (layer.params.get("first_perm") or [0])[0] == 0,
          params=dict(op=one_of(*REDUCE_OPS), axes=axes, keep_dims=optional(boolean),
                      first_perm=optional(permutation(RANK))))
def _reduce(layer):
    """Reduce ``axes`` of x, or of x transposed by ``first_perm`` when given (a fused Shuffle)."""
    x = layer.inputs[0]
    if layer.params["op"] not in REDUCE_OPS:
        raise NetworkError(f"unknown Reduce op {layer.params['op']!r}")
    axes = _axes(layer)
    perm = layer.params.get("first_perm")
    shape = x.shape if perm is None else tuple(x.shape[i] for i in perm)
    if layer.params.get("keep_dims"):
        shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        shape = tuple(d for i, d in enumerate(shape) if i not in axes)
    return [(x.dtype, shape)]


@register("ArgReduce", rowwise=lambda layer, batched: layer.params["axis"] % layer.inputs[0].rank != 0,
          params=dict(op=one_of("max", "min"), axis=axis))
def _argreduce(layer):
    x = layer.inputs[0]
    axis = layer.params["axis"] % x.rank
    return [("int32", tuple(d for i, d in enumerate(x.shape) if i != axis))]


def _shuffle_rowwise(layer, batched):
    """Transposes that keep axis 0 first; a reshape in between keeps each row's entries together (dim 0 in
    row-major order), so the output's rows stay apart when its dim 0 is a multiple of the batch (which
    ``runtime.rowwise`` checks for every batched tensor)."""
    p = layer.params
    return all(p.get(key) is None or p[key][0] == 0 for key in ("first_perm", "second_perm"))


@register("Shuffle", rowwise=_shuffle_rowwise, params=dict(
    first_perm=optional(permutation(RANK)), reshape=optional(ints(lo=-1)), second_perm=optional(permutation())))
def _shuffle(layer):
    x = layer.inputs[0]
    return [(x.dtype, shuffle_shapes(x.shape, layer.params))]


@register("Padding", rowwise=lambda layer, batched: layer.params["pre"][0] == 0 and layer.params["post"][0] == 0,
          params=dict(pre=ints(RANK, 0), post=ints(RANK, 0), mode=optional(one_of(*PADDING_MODES)),
                      value=optional(number())))
def _padding(layer):
    x = layer.inputs[0]
    pre, post = layer.params["pre"], layer.params["post"]
    if len(pre) != x.rank or len(post) != x.rank:
        raise NetworkError(f"padding needs {x.rank} entries")
    return [(x.dtype, tuple(d + a + b for d, a, b in zip(x.shape, pre, post)))]


def _concat_rowwise(layer, batched):
    axis = layer.params["axis"] % layer.inputs[0].rank
    return axis != 0 and all(batched)


@register("Concatenation", rowwise=_concat_rowwise, params=dict(axis=axis))
def _concat(layer):
    first = layer.inputs[0]
    axis = layer.params["axis"] % first.rank
    for t in layer.inputs[1:]:
        if t.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise NetworkError(f"cannot concatenate {first.shape} and {t.shape} on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in layer.inputs)
    return [(first.dtype, tuple(shape))]


@register("Slice", rowwise=lambda layer, batched: (layer.params["start"][0] == 0 and layer.params["stride"][0] == 1
                                                    and layer.params["size"][0] == layer.inputs[0].shape[0]),
          params=dict(start=ints(RANK, 0), size=ints(RANK, 0), stride=ints(RANK)))
def _slice(layer):
    x = layer.inputs[0]
    p = layer.params
    if not (len(p["start"]) == len(p["size"]) == len(p["stride"]) == x.rank):
        raise NetworkError(f"Slice needs start/size/stride of rank {x.rank}")
    for d, s, n, st in zip(x.shape, p["start"], p["size"], p["stride"]):
        if n and (st == 0 or not 0 <= s < d or not 0 <= s + (n - 1) * st < d):
            raise NetworkError(f"Slice start {p['start']}, size {p['size']}, stride {p['stride']} leaves "
                               f"{list(x.shape)}")
    return [(x.dtype, tuple(p["size"]))]


@register("Softmax", rowwise=lambda layer, batched: layer.params["axis"] % layer.inputs[0].rank != 0,
          params=dict(axis=axis))
def _softmax(layer):
    return _same_as_input(layer)


class _Operand(NamedTuple):
    shape: Tuple[int, ...]
    dtype: str


@register("Attention", rowwise=lambda layer, batched: all(batched), work=layer_costs.attention_work,
          scratch=layer_costs.attention_scratch, params=dict(
    scale=number(), heads=optional(integer(1)), columns=optional(list_of(ints(2, 0), 3)),
    causal=optional(boolean), mask_value=optional(number(finite=False))))
def _attention(layer):
    """softmax(masked(q k^T * ``scale``), last axis) v, in fp32. ``heads`` None: q [*B, Sq, D], k [*B, Sk, D],
    v [*B, Sk, Dv] -> [*B, Sq, Dv]. ``heads`` H (packed, rank 3): q [B, Sq, H*D], k [B, Sk, H*D], v [B, Sk, H*Dv]
    -> [B, Sq, H*Dv]; head h reads columns h*D:(h+1)*D of q and k, h*Dv:(h+1)*Dv of v, and writes those of the
    output (no transposes). Packed, ``columns`` [[start, width]] x 3 reads q, k, v as those columns of wider
    inputs (a fused QKV projection's output).
    Masks: an optional 4th input, bool, broadcasting to the scores ([B, H, Sq, Sk] packed), keeps the scores where
    it is true; ``causal`` keeps those of keys j <= query i; the others become ``mask_value`` (as Keras's
    where(mask, scores, large_negative): a fully masked row gives a uniform softmax)."""
    heads, scale = layer.params.get("heads"), layer.params["scale"]
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise NetworkError(f"Attention scale {scale!r} is not a number")
    if len(layer.inputs) not in (3, 4):
        raise NetworkError(f"Attention takes q, k, v and an optional mask, got {len(layer.inputs)} inputs")
    cols = layer.params.get("columns")
    if cols is not None and (heads is None or len(cols) != 3 or any(
            len(c) != 2 or type(c[0]) is not int or type(c[1]) is not int or c[0] < 0 or c[1] <= 0
            or c[0] + c[1] > t.shape[-1] for c, t in zip(cols, layer.inputs))):
        raise NetworkError(f"Attention columns {cols!r} are not three [start, width] windows inside the inputs' "
                           f"last dims of a packed Attention")
    q, k, v = (_Operand(t.shape[:-1] + (w,), t.dtype)
               for t, (_, w) in zip(layer.inputs[:3], attention_columns(layer)))
    if heads is not None and (type(heads) is not int or heads <= 0 or len(q.shape) != 3 or q.shape[-1] % heads
                              or v.shape[-1] % heads):
        raise NetworkError(f"Attention with {heads!r} heads needs rank-3 q, k, v whose last dims they divide, "
                           f"got {q.shape}, {v.shape}")
    if (len(q.shape) < 3 or not len(q.shape) == len(k.shape) == len(v.shape)
            or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2] or q.shape[-1] != k.shape[-1]
            or k.shape[-2] != v.shape[-2] or not q.dtype == k.dtype == v.dtype):
        raise NetworkError(f"Attention needs q [*B, Sq, D], k [*B, Sk, D], v [*B, Sk, Dv] of one dtype and rank >= 3, "
                           f"got {q.shape}, {k.shape}, {v.shape}")
    masked = len(layer.inputs) == 4 or bool(layer.params.get("causal"))
    if masked != (layer.params.get("mask_value") is not None):
        raise NetworkError("Attention takes a mask_value exactly when it has a mask input or is causal")
    if len(layer.inputs) == 4:
        mask, scores = layer.inputs[3], attention_scores_shape(layer)
        if mask.dtype != "bool" or mask.rank != len(scores) or broadcast_shape(mask.shape, scores) != scores:
            raise NetworkError(f"Attention mask must be bool and broadcast to the scores {list(scores)}, got "
                               f"{mask.dtype} {list(mask.shape)}")
    return [(q.dtype, (*q.shape[:-1], v.shape[-1]))]


@register("Normalization", rowwise=lambda layer, batched: all(batched), params=dict(epsilon=number(0)))
def _normalization(layer):
    """Layer normalization over the last axis, in fp32: s = x (+ residual, x's shape);
    (s - mean) / sqrt(var + ``epsilon``) * scale + bias, population variance, weights scale and bias [C]."""
    x = layer.inputs[0]
    eps = layer.params["epsilon"]
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        raise NetworkError(f"Normalization epsilon {eps!r} is not a number")
    if x.rank == 0 or len(layer.inputs) > 2 or any(t.shape != x.shape or t.dtype != x.dtype for t in layer.inputs):
        raise NetworkError(f"Normalization needs x of rank >= 1 and at most a residual like it, got "
                           f"{[t.shape for t in layer.inputs]}")
    for key in ("scale", "bias"):
        if layer.weights[key].shape != x.shape[-1:]:
            raise NetworkError(f"Normalization {key} has shape {layer.weights[key].shape}, not [{x.shape[-1]}]")
    return _same_as_input(layer)


def _gather_rowwise(layer, batched):
    """Batched data gathered along another axis, or constant data looked up by batched indices along
    axis 0 (an embedding lookup of token ids)."""
    axis = layer.params["axis"] % layer.inputs[0].rank
    if batched[0]:
        return not batched[1] and axis != 0
    return axis == 0 and layer.inputs[1].rank > 0


@register("Gather", rowwise=_gather_rowwise, params=dict(axis=axis))
def _gather(layer):
    x, idx = layer.inputs
    axis = layer.params["axis"] % x.rank
    return [(x.dtype, (*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]))]


@register("TopK", rowwise=lambda layer, batched: layer.params["axis"] % layer.inputs[0].rank != 0,
          work=layer_costs.topk_work, params=dict(k=integer(0), axis=axis))
def _topk(layer):
    """The k largest values along ``axis`` (largest first, ties to the lower index) and their int32 indices."""
    x = layer.inputs[0]
    axis, k = layer.params["axis"] % x.rank, layer.params["k"]
    if not 0 <= k <= x.shape[axis]:
        raise NetworkError(f"k={k} is out of range for axis {axis} of size {x.shape[axis]}")
    shape = (*x.shape[:axis], k, *x.shape[axis + 1:])
    return [(x.dtype, shape), ("int32", shape)]


@register("NMS", rowwise=lambda layer, batched: all(batched), work=layer_costs.nms_work,
          scratch=layer_costs.nms_scratch, params=dict(
    max_output_size_per_class=integer(1), max_total_size=integer(1), iou_threshold=number(0, 1),
    score_threshold=number(finite=False), pad_per_class=optional(boolean), clip_boxes=optional(boolean)))
def _nms(layer):
    """Per-class non-max suppression merged over classes (rows are independent).

    boxes [B, N, q, 4] (q is 1 or C), scores [B, N, C] -> boxes [B, D, 4], scores [B, D],
    classes [B, D] (float), valid detections [B] (int32); D from :func:`nms_detections`.
    """
    boxes, scores = layer.inputs
    if boxes.rank != 4 or boxes.shape[-1] != 4 or scores.rank != 3:
        raise NetworkError(f"NMS needs boxes [B, N, q, 4] and scores [B, N, C], got {boxes.shape} and {scores.shape}")
    b, n, q, _ = boxes.shape
    c = scores.shape[2]
    if scores.shape[:2] != (b, n) or q not in (1, c):
        raise NetworkError(f"NMS boxes {boxes.shape} do not match scores {scores.shape}")
    d = nms_detections(layer.params, c)
    return [(boxes.dtype, (b, d, 4)), (scores.dtype, (b, d)), (scores.dtype, (b, d)), ("int32", (b,))]


@register("Resize", rowwise=lambda layer, batched: batched[0], params=dict(
    mode=one_of(*RESIZE_MODES), sizes=ints(2, 1), align_corners=optional(boolean),
    half_pixel_centers=optional(boolean)))
def _resize(layer):
    """Channels-last 2-d resize of [N, H, W, C] to ``sizes`` [H', W'] with TF's coordinate rules
    (``align_corners``, ``half_pixel_centers``); linear always gives float32, as ResizeBilinear does."""
    x = layer.inputs[0]
    p = layer.params
    if p["mode"] not in RESIZE_MODES:
        raise NetworkError(f"unknown Resize mode {p['mode']!r} (known: {', '.join(RESIZE_MODES)})")
    if x.rank != 4 or len(p["sizes"]) != 2 or min(p["sizes"]) <= 0:
        raise NetworkError(f"Resize needs a [N, H, W, C] input and two positive sizes, got {x.shape}, {p['sizes']}")
    dtype = "float32" if p["mode"] == "linear" else x.dtype
    return [(dtype, (x.shape[0], *p["sizes"], x.shape[3]))]


@register("Bitcast", params=dict(dtype=one_of(*DTYPES)))
def _bitcast(layer):
    """The input's bits read as ``dtype``, of the same item size (float32 <-> int32): no value changes."""
    x, dtype = layer.inputs[0], layer.params["dtype"]
    if dtype not in DTYPES or np.dtype(DTYPES[dtype]).itemsize != np.dtype(DTYPES[x.dtype]).itemsize:
        raise NetworkError(f"cannot bitcast {x.dtype} to {dtype!r}: item sizes differ or the dtype is unknown")
    return [(dtype, x.shape)]
