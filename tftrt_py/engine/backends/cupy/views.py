"""Layers whose output is their input's memory reinterpreted: same-dtype identities, order-keeping reshapes and
transposes. The program gives them no step and no memory (an alias slot)."""
from __future__ import annotations

from tftrt_py.engine.layer_geometry import shuffle_shapes

__all__ = ["is_view"]


def _keeps_order(shape, perm) -> bool:
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def is_view(layer, in_dtype: str, out_dtype: str) -> bool:
    """The layer's output is its input's memory reinterpreted (no kernel needed)."""
    if layer.kind == "Identity":
        return in_dtype == out_dtype
    if layer.kind != "Shuffle" or in_dtype != out_dtype:
        return False
    p = layer.params
    shape = layer.inputs[0].shape
    if p.get("first_perm") is not None and not _keeps_order(shape, p["first_perm"]):
        return False
    if p.get("second_perm") is not None:
        mid = shuffle_shapes(shape, {"first_perm": p.get("first_perm"), "reshape": p.get("reshape")})
        if not _keeps_order(mid, p["second_perm"]):
            return False
    return True
