"""Attention fusion: softmax(q k^T * scale) v -- a MatrixMultiply (k read transposed, or given as k^T), scalar
scalings, a Softmax over the last axis and a MatrixMultiply with v -- as one Attention layer.

A Select(mask, scores, large negative constant) before the Softmax (Keras's masked Softmax: padding and causal
masks, keras-hub's BERT and GPT-2) becomes the Attention's mask input and ``mask_value``; in the mask, a logical
and with an all-true constant is dropped and one with a constant lower triangle (Keras's causal mask) becomes
``causal``, so that a padding mask reaches the kernel as [B, 1, 1, Sk].

When Shuffles split q, k and v into heads from packed [B, S, H*D] (or [B*S, H*D]) tensors ([B, S, H, D]
transposed to [B, H, S, D]; k^T to [B, H, D, S]) and merge the context back the same way, the Attention reads and
writes the packed tensors (``heads`` H, reshape views of 2-d ones): no head transposes. Packed q, k, v that
Slices cut as column windows from a wider tensor (a fused QKV projection) are read there (``columns``): no
copies. Split Shuffles and Slices that nothing else reads are left to dead-layer elimination.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.engine.reference import KERNELS
from tftrt_py.engine.builder.fusions.match import FLOATS, affine, constant_value, produced_by, record
from tftrt_py.engine.layer_geometry import causal_keep
from tftrt_py.engine.network import Layer, Tensor

__all__ = ["fuse_attention", "read_attention_windows", "MAX_SHUFFLES"]

logger = logging.getLogger(__name__)

#: at most this many Shuffles between a packed tensor and its heads
MAX_SHUFFLES = 4
#: heads as transposes of [B, S, H, D]: [B, H, S, D] (q, v, k read transposed) and [B, H, D, S] (k^T)
HEADS, HEADS_T = (0, 2, 1, 3), (0, 2, 3, 1)


@dataclasses.dataclass
class _Attention:
    layers: List[Layer]  # scores, scalings, softmax, context
    q: Tensor
    k: Tensor  # as the scores read it: [*B, Sk, D], or [*B, D, Sk] when k_transposed
    v: Tensor
    k_transposed: bool
    scale: float
    mask: Optional[Tensor] = None  # bool, broadcasting to the scores
    causal: bool = False
    mask_value: Optional[float] = None

    def params(self, heads: Optional[int]) -> dict:
        masked = self.mask is not None or self.causal
        return dict({"scale": self.scale, "heads": heads}, **(
            {"causal": self.causal, "mask_value": self.mask_value} if masked else {}))


def _plain(layer: Layer, transpose_b: Sequence[bool]) -> bool:
    """A MatrixMultiply without bias, activation or transposed A, transposing B as one of `transpose_b`."""
    p = layer.params
    return (layer.kind == "MatrixMultiply" and len(layer.inputs) == 2 and "bias" not in layer.weights
            and not p.get("activation")
            and not p.get("transpose_a") and bool(p.get("transpose_b")) in transpose_b)


def _match(network, users, layer: Layer) -> Optional[_Attention]:
    """The attention whose context MatrixMultiply is `layer`; its intermediates each have one reader."""
    if not _plain(layer, (False,)):
        return None
    probs, v = layer.inputs
    soft = produced_by(probs, "Softmax")
    if soft is None or soft.params["axis"] % probs.rank != probs.rank - 1 or not probs.shape[-1]:
        return None
    t, scale, scalings = soft.inputs[0], 1.0, []
    select, mask = _select(t)
    if select:
        scalings, t = [select], select.inputs[1]
    found = t.producer and affine(t.producer)
    while found and not np.any(found[2]) and np.all(found[1] == found[1][0]):  # uniform, no shift
        scalings.insert(0, t.producer)
        t, scale = found[0], scale * float(found[1][0])
        found = t.producer and affine(t.producer)
    scores = t.producer
    if scores is None or not _plain(scores, (False, True)):
        return None
    q, k = scores.inputs
    layers = [scores, *scalings, soft, layer]
    if (q.rank < 3 or not q.rank == k.rank == v.rank or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            or q.dtype not in FLOATS or not q.dtype == k.dtype == v.dtype == layer.outputs[0].dtype
            or any(len(users.get(l.outputs[0].name, ())) != 1 or network.is_output(l.outputs[0]) for l in layers[:-1])):
        return None
    m = _Attention(layers, q, k, v, not scores.params.get("transpose_b"), scale)
    if select:
        m.mask, m.causal = _simplified(mask, t.shape)
        m.mask_value = float(constant_value(select.inputs[2]).item())
    return m


def _select(t: Tensor) -> Tuple[Optional[Layer], Optional[Tensor]]:
    """(Select, bool mask) when `t` = Select(mask, scores, scalar constant) has the scores' shape."""
    select = produced_by(t, "Select")
    if select is None:
        return None, None
    mask, scores, other = select.inputs
    value = constant_value(other)
    if (value is None or value.size != 1 or mask.dtype != "bool" or scores.shape != t.shape
            or mask.rank != t.rank or np.broadcast_shapes(mask.shape, t.shape) != t.shape):
        return None, None
    return select, mask


def _causal(value: np.ndarray, shape) -> bool:
    """True when the constant `value` is Keras's causal mask (key j <= query i) broadcast to `shape`."""
    return value.dtype == np.bool_ and np.array_equal(np.broadcast_to(value, shape),
                                                      np.broadcast_to(causal_keep(*shape[-2:]), shape))


def _mask_constant(t: Tensor) -> Optional[np.ndarray]:
    """The value of a constant mask, also of one repeated over the batch row by row (Select(c, row, row): what
    the converter makes of a constant shaped by the batch size, e.g. ``tf.ones`` of a dynamic shape)."""
    select = produced_by(t, "Select")
    if select is not None and select.inputs[1] is select.inputs[2]:
        value = constant_value(select.inputs[1])
        return None if value is None else np.broadcast_to(value, t.shape)
    return constant_value(t)


def _simplified(mask: Tensor, shape) -> Tuple[Optional[Tensor], bool]:
    """(mask, causal) keeping what `mask` keeps of scores of `shape`: logical ands with an all-true constant
    dropped, a constant causal triangle as ``causal``; no mask where nothing else is left."""
    causal = False
    while True:
        value = _mask_constant(mask)
        if value is not None and (value.all() or _causal(value, shape)):
            return None, causal or not value.all()
        found = produced_by(mask, "ElementWise", "and")
        for c, other in (found.inputs, found.inputs[::-1]) if found else ():
            value = _mask_constant(c)
            if value is not None and other.rank == len(shape) and (value.all() or _causal(value, shape)):
                causal, mask = causal or not value.all(), other
                break
        else:
            return mask, causal


def _index(shape) -> np.ndarray:
    size = int(np.prod(shape))
    return np.arange(size, dtype=np.int32 if size < 2 ** 31 else np.int64).reshape(shape)


def _moved(shuffles: List[Layer], shape) -> np.ndarray:
    """Where `shuffles` (in order) move each element of a tensor of `shape`: its flat indices, shuffled."""
    index = _index(shape)
    for s in shuffles:
        index = KERNELS["Shuffle"](s, [index])[0]
    return index


#: _moves_as's answers by (the shuffles' parameters and output shapes, the shapes and permutation compared): every
#: layer of a transformer asks the same questions, each over index arrays of a whole activation
_MOVES: Dict[tuple, bool] = {}
MAX_MOVES = 256


def _moves_as(shuffles: List[Layer], shape, heads, perm, out_shape) -> bool:
    """Whether `shuffles` (in order) move the elements of a tensor of `shape` as transposing one of shape `heads` by
    `perm` and reshaping it to `out_shape` does."""
    key = (tuple((repr(sorted(s.params.items())), s.outputs[0].shape) for s in shuffles), tuple(shape),
           tuple(heads), tuple(perm), tuple(out_shape))
    same = _MOVES.get(key)
    if same is None:
        moved = _moved(shuffles, shape)
        same = moved.shape == tuple(out_shape) and np.array_equal(moved, _index(heads).transpose(perm).reshape(
            out_shape))
        if len(_MOVES) >= MAX_MOVES:
            _MOVES.clear()
        _MOVES[key] = same
    return same


def _packed(b: int, s: int, width: int) -> Tuple[Tuple[int, ...], ...]:
    return (b, s, width), (b * s, width)


def _split_source(t: Tensor, perm: Tuple[int, ...]) -> Optional[Tensor]:
    """The packed tensor whose heads Shuffles lay out as `t` ([B, S, H, D] transposed by `perm`)."""
    if t.rank != 4:
        return None
    b, s, h, d = (t.shape[perm.index(i)] for i in range(4))
    shuffles = []
    for _ in range(MAX_SHUFFLES):
        shuffle = produced_by(t, "Shuffle")
        if shuffle is None:
            return None
        shuffles.insert(0, shuffle)
        t = shuffle.inputs[0]
        if t.shape in _packed(b, s, h * d) and _moves_as(shuffles, t.shape, (b, s, h, d), perm,
                                                         tuple((b, s, h, d)[i] for i in perm)):
            return t
    return None


def _merge(network, users, t: Tensor) -> Optional[Tuple[Tensor, List[Layer]]]:
    """(packed tensor, Shuffles) when Shuffles, each the sole reader of the tensor before, merge the heads of the
    context `t` [B, H, S, Dv] into [B, S, H*Dv] or [B*S, H*Dv]."""
    b, h, s, dv = t.shape
    shuffles = []
    for _ in range(MAX_SHUFFLES):
        readers = users.get(t.name, ())
        if len(readers) != 1 or readers[0].kind != "Shuffle" or network.is_output(t):
            return None
        shuffles.append(readers[0])
        t = readers[0].outputs[0]
        if t.shape in _packed(b, s, h * dv) and _moves_as(shuffles, (b, h, s, dv), (b, h, s, dv), HEADS, t.shape):
            return t, shuffles
    return None


def _window(t: Tensor) -> Tuple[Tensor, int]:
    """(wider tensor, first column) when a Slice cuts `t` from it as whole rows of consecutive columns of the
    last dim (q, k or v sliced from a fused QKV projection), else (t, 0)."""
    s = produced_by(t, "Slice")
    if s is not None:
        x, p = s.inputs[0], s.params
        if set(p["stride"]) == {1} and not any(p["start"][:-1]) and tuple(p["size"][:-1]) == x.shape[:-1]:
            return x, p["start"][-1]
    return t, 0


def _shuffled(network, t: Tensor, params: dict, name: str) -> Tensor:
    """`t` moved by a Shuffle of `params`: the same values, so the same dynamic range."""
    out = network.add_layer("Shuffle", [t], params, name=name).outputs[0]
    out.dynamic_range = t.dynamic_range
    return out


def _reshaped(network, t: Tensor, shape, name: str) -> Tensor:
    """`t` when it has `shape`, else a reshape view of it."""
    shape = tuple(shape)
    return t if t.shape == shape else _shuffled(network, t, {"reshape": list(shape)}, name)


def _rewrite(network, users, m: _Attention) -> str:
    """Replace the attention `m` by an Attention layer (packed when its head Shuffles allow); its name."""
    name = " + ".join(l.name for l in m.layers)
    sources = [_split_source(m.q, HEADS), _split_source(m.k, HEADS_T if m.k_transposed else HEADS),
               _split_source(m.v, HEADS)]
    merged = all(t is not None for t in sources) and _merge(network, users, m.layers[-1].outputs[0])
    if merged:
        old, shuffles = merged
        layers, batch = m.layers + shuffles, m.q.shape[0]
        name += "".join(f" + {s.name}" for s in shuffles)
        with network.inserting_before(shuffles[-1]):
            inputs = [_reshaped(network, t, (batch, int(np.prod(t.shape[:-1])) // batch, t.shape[-1]),
                                f"{name} ({role})") for t, role in zip(sources, "qkv")]
            inputs += [m.mask] if m.mask is not None else []
            attention = network.add_layer("Attention", inputs, m.params(m.q.shape[1]), name=name)
            new = _reshaped(network, attention.outputs[0], old.shape, f"{name} (rows)")
    else:
        old, layers, k = m.layers[-1].outputs[0], m.layers, m.k
        with network.inserting_before(m.layers[-1]):
            if m.k_transposed:
                perm = [*range(k.rank - 2), k.rank - 1, k.rank - 2]
                k = _shuffled(network, k, {"first_perm": perm}, f"{name} (k)")
            inputs = [m.q, k, m.v] + ([m.mask] if m.mask is not None else [])
            attention = network.add_layer("Attention", inputs, m.params(None), name=name)
            new = attention.outputs[0]
    network.replace_all_uses(old, new)
    for layer in reversed(layers):
        network.erase(layer)
    if network.is_output(new):
        new.name = old.name
    return attention.name


def fuse_attention(network) -> bool:
    """Replace each attention (q k^T, scalings, Softmax, times v) by an Attention layer."""
    changed = False
    users = network.consumers()
    for layer in list(network.layers):
        m = layer.kind == "MatrixMultiply" and _match(network, users, layer)
        if m:
            logger.info("attention: %s", _rewrite(network, users, m))
            record(network, "attention")
            users = network.consumers()
            changed = True
    return changed


def _unviewed(t: Tensor) -> Tensor:
    """The tensor `t` is a reshape view of (a Shuffle that only reshapes), else `t`."""
    view = produced_by(t, "Shuffle")
    only_reshape = view is not None and not any(view.params.get(k) for k in ("first_perm", "second_perm"))
    return view.inputs[0] if only_reshape else t


def read_attention_windows(network) -> bool:
    """Let packed Attention layers read q, k and v where Slices cut them from one wider tensor (``columns``)."""
    changed = False
    for layer in [l for l in network.layers if l.kind == "Attention"]:
        if not layer.params.get("heads") or layer.params.get("columns"):
            continue
        old, mask = layer.inputs[:3], layer.inputs[3:]
        windows = [_window(_unviewed(t)) for t in old]
        if all(w is _unviewed(t) for (w, _), t in zip(windows, old)):
            continue
        views = {}
        with network.inserting_before(layer):
            for (w, _), t in zip(windows, old):
                if w.name not in views:
                    views[w.name] = _reshaped(network, w, (*t.shape[:-1], w.shape[-1]), f"{layer.name} ({w.name})")
        layer.inputs = [views[w.name] for w, _ in windows] + mask
        layer.params = dict(layer.params, columns=[[c, t.shape[-1]] for (_, c), t in zip(windows, old)])
        logger.info("attention %s reads its inputs in place: columns %s", layer.name, layer.params["columns"])
        changed = True
    return changed
