"""Shape arithmetic of layer kinds, shared by their shape rules (:mod:`layers`), their costs
(:mod:`layer_costs`), the builder's fusions and the backends' kernels."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from tftrt_py.engine.errors import NetworkError

__all__ = ["volume", "broadcast_shape", "conv_output_size", "shuffle_shapes", "attention_columns",
           "attention_scores_shape", "causal_keep", "nms_detections"]


def volume(shape: Sequence[int]) -> int:
    """Elements of a tensor of `shape`, as an exact Python int."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


def broadcast_shape(*shapes: Sequence[int]) -> Tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise NetworkError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def conv_output_size(size: int, k: int, stride: int, dilation: int, pre: int, post: int) -> int:
    out = (size + pre + post - dilation * (k - 1) - 1) // stride + 1
    if out <= 0:
        raise NetworkError(f"window {k} (dilation {dilation}) does not fit input size {size} with padding {pre}+{post}")
    return out


def shuffle_shapes(shape: Sequence[int], params) -> Tuple[int, ...]:
    """Shape after a Shuffle: first transpose, then reshape, then second transpose."""
    shape = tuple(shape)
    if params.get("first_perm") is not None:
        shape = tuple(shape[i] for i in params["first_perm"])
    if params.get("reshape") is not None:
        dims = list(params["reshape"])
        size = int(np.prod(shape))
        if dims.count(-1) == 1:
            known = int(np.prod([d for d in dims if d != -1]))
            dims[dims.index(-1)] = size // known if known else 0
        if int(np.prod(dims)) != size:
            raise NetworkError(f"cannot reshape {list(shape)} to {params['reshape']}")
        shape = tuple(dims)
    if params.get("second_perm") is not None:
        shape = tuple(shape[i] for i in params["second_perm"])
    return shape


def attention_columns(layer) -> List[Tuple[int, int]]:
    """(first column, width) of q, k and v in each input's last dim: ``columns`` of a packed Attention, else
    the whole dim (a fused projection's output read in place instead of sliced)."""
    cols = layer.params.get("columns")
    return [tuple(c) for c in cols] if cols else [(0, t.shape[-1]) for t in layer.inputs[:3]]


def causal_keep(sq: int, sk: int) -> np.ndarray:
    """The scores a causal Attention keeps: [Sq, Sk] bool, key j <= query i (Keras's tril of ones)."""
    return np.arange(sk)[None, :] <= np.arange(sq)[:, None]


def attention_scores_shape(layer) -> Tuple[int, ...]:
    """Shape of the scores q k^T: [B, H, Sq, Sk] packed, else [*B, Sq, Sk]."""
    q, k = layer.inputs[:2]
    heads = layer.params.get("heads")
    return (q.shape[0], heads, q.shape[1], k.shape[1]) if heads else (*q.shape[:-1], k.shape[-2])


def nms_detections(params, num_classes: int) -> int:
    """Detections per batch row that NMS outputs (TF's CombinedNonMaxSuppression padding rule)."""
    total = params["max_total_size"]
    if params.get("pad_per_class"):
        return min(total, params["max_output_size_per_class"] * num_classes)
    return total
