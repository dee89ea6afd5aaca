"""The values converters read and write: a data input's facts (InputInfo) and build-time constants (Weights)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple, Union

import numpy as np

from tftrt_py.engine.network import Tensor

__all__ = ["InputInfo", "Weights", "Value", "shape_of"]


@dataclasses.dataclass(frozen=True)
class InputInfo:
    dtype: str
    shape: Optional[Tuple[Optional[int], ...]]  # None: unknown rank
    value: Optional[np.ndarray] = None  # set when the input is a constant
    static: bool = False  # the value is known when building (a constant or computed from constants/shapes)

    @property
    def rank(self) -> Optional[int]:
        return None if self.shape is None else len(self.shape)


class Weights:
    """A constant operand known at build time (from a Const node or folded shape arithmetic).

    `batch_source`: the engine tensor whose dim 0 (its batch, or a multiple of it) the value was computed
    from, if any. How the value depends on that dim 0 decides how :meth:`ConversionContext.as_tensor`
    emits it:

    - `rows`: it is one row, computed without the batch, repeated along dim 0 (whose size is the
      source's): emitted as that row broadcast over the source's rows, so the engine stays row-wise;
    - `entries` (bools shaped like the value): the entries that are the source's dim 0 itself (a
      measured shape passed on unchanged), the others computed without it; Fill, BroadcastTo and Tile
      read them to make `rows` values;
    - neither: any other way; the value pins the engine to the batch it was built for.
    """

    def __init__(self, value, batch_source: Optional[Tensor] = None, entries=None, rows: bool = False):
        self.value = np.asarray(value)
        if entries is not None and not np.any(entries):
            batch_source = None  # no entry is the batch: the value does not depend on it
        self.batch_source = batch_source
        self.entries = None if batch_source is None or entries is None else np.asarray(entries, np.bool_)
        self.rows = batch_source is not None and rows
        if self.rows and (not self.value.ndim or self.value.shape[0] != batch_source.shape[0]):
            raise ValueError(f"rows of {batch_source.name} need dim 0 = {batch_source.shape[0]}, got {self.shape}")

    @classmethod
    def derived(cls, value, *operands) -> "Weights":
        """Weights computed from `operands` in any way: pinned to the batch source of the first that has one."""
        return cls(value, next((v.batch_source for v in operands if isinstance(v, Weights) and v.batch_source
                                is not None), None))

    @classmethod
    def sized(cls, value, shape: "Weights", used=None) -> "Weights":
        """`value`, whose entries are computed without the batch, shaped by the shape vector `shape` on the dims
        `used` (all by default): rows when only dim 0 is the batch, pinned when other used dims depend on it."""
        used = np.ones(shape.shape, np.bool_) if used is None else np.asarray(used, np.bool_)
        depends = shape.depends() & used
        if not depends.any():
            return cls(value)
        rows = shape.entries is not None and depends[0] and not depends[1:].any()
        return cls(value, shape.batch_source, rows=rows)

    def depends(self) -> np.ndarray:
        """Per entry, whether it may depend on the batch."""
        if self.batch_source is None:
            return np.zeros(self.shape, np.bool_)
        return self.entries if self.entries is not None else np.ones(self.shape, np.bool_)

    @property
    def dtype(self) -> str:
        return self.value.dtype.name

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.value.shape

    @property
    def rank(self) -> int:
        return self.value.ndim


Value = Union[Tensor, Weights]


def shape_of(value: Value, dtype=np.int32) -> Weights:
    """The shape of `value` as Weights of `dtype` (int32 or int64): dim 0 of a tensor, or of rows, is the batch
    entry; other Weights have a shape computed without the batch unless they are pinned."""
    shape = np.asarray(value.shape, dtype)
    if isinstance(value, Tensor) or value.rows:
        source = value if isinstance(value, Tensor) else value.batch_source
        return Weights(shape, source, entries=np.arange(shape.size) == 0)
    return Weights(shape, value.batch_source if value.entries is None else None)
