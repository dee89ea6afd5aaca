"""Tensors between a front-end worker process and the model process through shared memory: an Arena is one
anonymous memory file (memfd: it has no name under /dev/shm, and the kernel frees it once the last process that
maps it closes it or exits, crash or not) mapped by both processes. The process that writes an arena allocates
in it; a message names the block and the tensors in it (dtype, shape, offset), and the reader maps them as
arrays without copying. A tensor that cannot go there (strings: numpy object arrays; an arena without room for
the message's tensors) travels in the message itself."""
from __future__ import annotations

import bisect
import mmap
import os
import threading
from multiprocessing import reduction
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

__all__ = ["Arena", "SharedFd", "Descriptor", "ALIGN"]

ALIGN = 64  # bytes: every tensor starts on a cache line
#: (name, dtype or its type string, shape, offset) of a tensor in the arena, or (name, array) of one carried in the
#: message
Descriptor = Tuple[Any, ...]


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _portable(dtype: np.dtype):
    """`dtype` as its type string where that names it (cheaper to pickle and to read back than the dtype),
    else the dtype itself (ml_dtypes' bfloat16 and float8 types, whose string is a void type's)."""
    return dtype.str if dtype.kind != "V" else dtype


class Arena:
    """`size` bytes of shared memory: a new memory file, or the one `fd` refers to (mapped here, the fd closed).
    allocate/free hand out blocks first-fit (free neighbours merge); thread-safe."""

    def __init__(self, size: int, fd: Optional[int] = None):
        if size <= 0:
            raise ValueError(f"an arena needs a size > 0 bytes, got {size}")
        owned = fd is None
        if owned:
            fd = os.memfd_create("tftrt-serve-tensors", os.MFD_CLOEXEC)
        try:
            if owned:
                os.ftruncate(fd, size)  # pages are taken only as tensors touch them
            self._map = mmap.mmap(fd, size)
        finally:
            if not owned:
                os.close(fd)
        self.fd = fd if owned else None  # to hand to the other process (DupFd), then close_fd()
        self.size = size
        self._free: List[Tuple[int, int]] = [(0, size)]  # (offset, size), sorted by offset
        self._used: Dict[int, int] = {}  # block offset -> size
        self._lock = threading.Lock()

    def close_fd(self) -> None:
        """Close the memory file's descriptor (the mapping stays) once the other process holds its own."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def allocate(self, nbytes: int) -> Optional[int]:
        """The offset of a free block of at least `nbytes`, else None."""
        nbytes = _aligned(max(nbytes, 1))
        with self._lock:
            for i, (offset, size) in enumerate(self._free):
                if size >= nbytes:
                    if size == nbytes:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + nbytes, size - nbytes)
                    self._used[offset] = nbytes
                    return offset
        return None

    def free(self, offset: int) -> None:
        with self._lock:
            size = self._used.pop(offset)
            i = bisect.bisect(self._free, (offset, size))
            if i < len(self._free) and offset + size == self._free[i][0]:  # merge with the next free block
                size += self._free.pop(i)[1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:  # and with the previous one
                offset, size = self._free[i - 1][0], self._free[i - 1][1] + size
                del self._free[i - 1]
                i -= 1
            self._free.insert(i, (offset, size))

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._used.values())

    def write(self, arrays: Mapping[str, np.ndarray]) -> Tuple[int, List[Descriptor]]:
        """(block offset, or -1 for none; descriptors) of `arrays` copied into one block of the arena; those
        that cannot go there ride along in the descriptors."""
        shared = {k: a for k, a in arrays.items() if not a.dtype.hasobject and a.nbytes}
        block = self.allocate(sum(_aligned(a.nbytes) for a in shared.values())) if shared else None
        if block is None:
            return -1, [(k, a) for k, a in arrays.items()]
        descriptors: List[Descriptor] = []
        offset = block
        for name, array in arrays.items():
            if name not in shared:
                descriptors.append((name, array))
                continue
            np.copyto(np.ndarray(array.shape, array.dtype, buffer=self._map, offset=offset), array, casting="no")
            descriptors.append((name, _portable(array.dtype), array.shape, offset))
            offset += _aligned(array.nbytes)
        return block, descriptors

    def read(self, descriptors: List[Descriptor], copy: bool = False) -> Dict[str, np.ndarray]:
        """The arrays `descriptors` name: views of the arena (valid until their block is freed; read-only, as the
        other process can still write them: what must not change while it is read, a model's input, is copied
        first), or copies."""
        arrays = {}
        for entry in descriptors:
            if len(entry) == 2:
                arrays[entry[0]] = entry[1]
                continue
            name, dtype, shape, offset = entry
            view = np.ndarray(shape, dtype, buffer=self._map, offset=offset)
            if copy:
                view = view.copy()
            else:
                view.flags.writeable = False
            arrays[name] = view
        return arrays


class SharedFd:
    """A memory file's descriptor as an argument of a spawned process: the child receives a duplicate of its own
    (an int) when it unpickles the arguments."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(duplicate) -> int:
    return duplicate.detach()
