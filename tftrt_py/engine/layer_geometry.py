"""Shape arithmetic of layer kinds, shared by their shape rules (:mod:`layers`), their costs
(:mod:`layer_costs`), the builder's fusions and the backends' kernels."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from tftrt_py.engine.errors import NetworkError

__all__ = ["volume", "broadcast_shape", "conv_output_size", "shuffle_shapes", "attention_columns",
           "attention_scores_shape", "causal_keep", "nms_detections", "space_to_batch_layers",
           "batch_to_space_layers"]

#: (layer kind, params): one layer of a decomposition into layer kinds
LayerSpec = Tuple[str, dict]


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


def space_to_batch_layers(shape: Sequence[int], block: Sequence[int], pre: Sequence[int], post: Sequence[int]
                          ) -> List[LayerSpec]:
    """TF's SpaceToBatchND of a tensor of `shape` [N, *spatial (M dims), *rest] as layers: zero Padding of the
    spatial dims (`pre`, `post`: M entries each; none where all are 0), a Shuffle splitting each padded spatial dim
    S into [S / b, b] and moving the M block axes first, and a Shuffle merging them into the batch:
    [prod(block) * N, *(S / b), *rest]. Each padded dim must be a multiple of its block."""
    m, n, rest = len(block), int(shape[0]), [int(d) for d in shape[1 + len(block):]]
    padded = [int(d) + a + b for d, a, b in zip(shape[1:1 + m], pre, post)]
    if any(d % b for d, b in zip(padded, block)):
        raise NetworkError(f"SpaceToBatch: padded spatial dims {padded} are not multiples of the block {list(block)}")
    layers: List[LayerSpec] = []
    if any(pre) or any(post):
        zeros = [0] * len(rest)
        layers.append(("Padding", {"pre": [0, *map(int, pre), *zeros], "post": [0, *map(int, post), *zeros]}))
    split = [n] + [v for d, b in zip(padded, block) for v in (d // b, int(b))] + rest
    blocks = [2 + 2 * i for i in range(m)]
    grid = [0] + [1 + 2 * i for i in range(m)] + [1 + 2 * m + i for i in range(len(rest))]
    layers.append(("Shuffle", {"reshape": split, "second_perm": blocks + grid}))
    layers.append(("Shuffle", {"reshape": [volume(block) * n] + [d // b for d, b in zip(padded, block)] + rest}))
    return layers


def batch_to_space_layers(shape: Sequence[int], block: Sequence[int], crop_pre: Sequence[int],
                          crop_post: Sequence[int]) -> List[LayerSpec]:
    """TF's BatchToSpaceND of a tensor of `shape` [prod(block) * N, *spatial (M dims), *rest] as layers: a Shuffle
    splitting the batch into [*block, N] and interleaving each block axis after its spatial dim, a Shuffle merging
    them ([N, *(S * b), *rest]), and a Slice of the crops (none where all are 0)."""
    m, rest = len(block), [int(d) for d in shape[1 + len(block):]]
    if int(shape[0]) % volume(block):
        raise NetworkError(f"BatchToSpace: batch {shape[0]} is not a multiple of the block {list(block)}")
    n, spatial = int(shape[0]) // volume(block), [int(d) for d in shape[1:1 + m]]
    perm = [m] + [v for i in range(m) for v in (m + 1 + i, i)] + [1 + 2 * m + i for i in range(len(rest))]
    full = [d * b for d, b in zip(spatial, block)]
    layers: List[LayerSpec] = [("Shuffle", {"reshape": [*map(int, block), n, *spatial, *rest], "second_perm": perm}),
                               ("Shuffle", {"reshape": [n, *full, *rest]})]
    if any(crop_pre) or any(crop_post):
        kept = [d - a - b for d, a, b in zip(full, crop_pre, crop_post)]
        if any(k <= 0 for k in kept):
            raise NetworkError(f"BatchToSpace: crops {list(crop_pre)} + {list(crop_post)} leave nothing of {full}")
        zeros = [0] * len(rest)
        layers.append(("Slice", {"start": [0, *map(int, crop_pre), *zeros], "size": [n, *kept, *rest],
                                 "stride": [1] * (1 + m + len(rest))}))
    return layers


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
