"""The input arrays of a batch: one per input name, max_batch_size rows, 64-byte aligned (TensorFlow reads such an
array in place, see models.py). The batch scheduler copies each request's rows into its batch's arrays as the
request comes, on the caller's thread, so the batch thread finds its batch gathered; arrays of one shape are
reused from batch to batch rather than allocated (and their pages faulted in) again for each."""
from __future__ import annotations

import threading
from typing import Dict, Hashable, List, Mapping, Tuple

import numpy as np

__all__ = ["ALIGN", "BufferPool", "aligned_empty", "copy_rows", "pad_rows"]

ALIGN = 64  # bytes: TensorFlow's allocator alignment, which its CPU kernels assume of every tensor


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an ALIGN-byte boundary."""
    dtype = np.dtype(dtype)
    if dtype.hasobject:  # references, not bytes: numpy initializes them, alignment means nothing to TensorFlow
        return np.empty(shape, dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def copy_rows(buffers: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray], start: int) -> None:
    """Copy each of `arrays` into rows start.. of the buffer of its name."""
    for name, array in arrays.items():
        np.copyto(buffers[name][start:start + len(array)], array, casting="no")


def pad_rows(buffers: Mapping[str, np.ndarray], rows: int, padded: int) -> Dict[str, np.ndarray]:
    """The first `padded` rows of each buffer, rows `rows`.. set to copies of row 0 (real data, whatever the model
    does with it)."""
    batch = {name: buffer[:padded] for name, buffer in buffers.items()}
    if padded > rows:
        for array in batch.values():
            array[rows:] = array[:1]
    return batch


class BufferPool:
    """Free batch buffers (`rows` rows each) by batch key (batching.batch_key): the `keep` sets given back last,
    enough for the batches running and the one filling without holding memory for every shape ever seen."""

    def __init__(self, rows: int, keep: int):
        self.rows, self.keep = rows, keep
        self._free: List[Tuple[Hashable, Dict[str, np.ndarray]]] = []  # oldest first
        self._lock = threading.Lock()

    def take(self, key: Hashable, arrays: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """A set of buffers for requests like `arrays` (whose batch key is `key`): a free one, else new."""
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if self._free[i][0] == key:
                    return self._free.pop(i)[1]
        return {name: aligned_empty((self.rows,) + a.shape[1:], a.dtype) for name, a in arrays.items()}

    def give_back(self, key: Hashable, buffers: Dict[str, np.ndarray]) -> None:
        """Return `buffers` once nothing reads them; object arrays are dropped (they hold the requests' strings)."""
        if any(b.dtype.hasobject for b in buffers.values()):
            return
        with self._lock:
            self._free.append((key, buffers))
            del self._free[:-self.keep]
