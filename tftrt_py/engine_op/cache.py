"""The per-op engine cache: LRU over input shapes, failed builds remembered without a slot.

Also the engine-cache file saved as a SavedModel asset (TF-TRT's name, :func:`engine_asset_name`): several
plans in one file; an empty file holds none (TF-TRT's ``save(..., save_gpu_specific_engines=False)``).
:func:`read_asset` is the one way such a file is read: a path TF hands the op is untrusted.
"""
from __future__ import annotations

import collections
import os
import stat
import struct
from typing import Dict, List, Optional, Sequence, Tuple

from tftrt_py import settings
from tftrt_py.engine.errors import PlanError
from tftrt_py.engine.plan import PlanWriter

__all__ = ["EngineCache", "engine_asset_name", "pack_plans", "write_plans", "unpack_plans", "read_asset",
           "MAX_ASSET_BYTES_ENV"]

Key = Tuple[Tuple[int, ...], ...]


class EngineCache:
    """Engines keyed by input shapes; the least recently used goes when a build finds it full."""

    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._entries: "collections.OrderedDict[Key, object]" = collections.OrderedDict()
        self.failed: Dict[Key, str] = {}

    def __len__(self):
        return len(self._entries)

    def engines(self) -> List[object]:
        return list(self._entries.values())

    def keys(self) -> List[Key]:
        return list(self._entries)

    def get(self, key: Key):
        """The engine cached under `key` (no LRU update)."""
        return self._entries[key]

    def lookup(self, shapes: Key) -> Optional[Key]:
        """The key of the engine serving `shapes`: an exact match, else the smallest engine that can.

        An engine may rank itself with a ``lookup_cost`` tuple (profile engines: the tightest profile wins).
        """
        if shapes not in self._entries:
            fits = [k for k, e in self._entries.items() if e.can_serve(shapes)]
            if not fits:
                return None
            shapes = min(fits, key=lambda k: (_cost(k, self._entries[k]), k))
        self._entries.move_to_end(shapes)
        return shapes

    def touch(self, key: Key) -> None:
        """Mark the engine under `key` used (most recently), if it is still cached."""
        if key in self._entries:
            self._entries.move_to_end(key)

    def insert(self, key: Key, engine) -> Optional[Key]:
        """Add an engine; returns the key evicted to make room, if any."""
        evicted = None
        if key not in self._entries and len(self._entries) >= self.capacity:
            evicted, _ = self._entries.popitem(last=False)
        self._entries[key] = engine
        self._entries.move_to_end(key)
        return evicted


def _cost(key: Key, engine) -> tuple:
    cost = getattr(engine, "lookup_cost", None)
    return tuple(cost) if cost is not None else (sum(_numel(s) for s in key), 0)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_MAGIC = b"TFTRTENG"
_HEAD = struct.Struct("<8sII")
_LEN = struct.Struct("<Q")
_VERSION = 1


def engine_asset_name(engine_op: str) -> str:
    """The asset file (under ``assets/``) holding `engine_op`'s engines, named as TF-TRT names it."""
    return f"trt-serialized-engine.{engine_op.split('/')[-1]}"


def pack_plans(plans: Sequence[bytes]) -> bytes:
    """One file holding several plans (an engine op's cache)."""
    body = [_HEAD.pack(_MAGIC, _VERSION, len(plans))]
    for plan in plans:
        body += [_LEN.pack(len(plan)), plan]
    return b"".join(body)


def write_plans(f, engines: Sequence[object], binding: Optional[str] = None) -> None:
    """Write the engine-cache file of `engines` (as :func:`pack_plans` of their plans) to binary file `f`, each
    plan streamed from its engine's weights (:class:`~tftrt_py.engine.plan.PlanWriter`), never whole in memory;
    `binding` replaces their binding digest (see PlanWriter)."""
    f.write(_HEAD.pack(_MAGIC, _VERSION, len(engines)))
    for engine in engines:
        writer = PlanWriter(engine, binding)
        f.write(_LEN.pack(writer.size))
        writer.write(f)


def unpack_plans(data: bytes) -> List[bytes]:
    if not data:
        return []
    if len(data) < _HEAD.size:
        raise PlanError("engine cache file is truncated")
    magic, version, count = _HEAD.unpack_from(data)
    if magic != _MAGIC or version != _VERSION:
        raise PlanError(f"not a tftrt_py engine cache file (magic {magic!r}, version {version})")
    plans, pos = [], _HEAD.size
    for _ in range(count):
        if pos + _LEN.size > len(data):
            raise PlanError("engine cache file is truncated")
        (n,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        if pos + n > len(data):
            raise PlanError("engine cache file is truncated")
        plans.append(data[pos:pos + n])
        pos += n
    return plans


#: Largest engine-cache asset read (env, bytes; default 8 GiB).
MAX_ASSET_BYTES_ENV = settings.MAX_ASSET_BYTES.name


def _max_asset_bytes() -> int:
    return settings.MAX_ASSET_BYTES.get()


def read_asset(path: str) -> bytes:
    """The bytes of an engine-cache asset: a regular file (no symlink, FIFO or device) directly inside a
    SavedModel's ``assets`` directory, at most MAX_ASSET_BYTES_ENV bytes; PlanError says why not."""
    parts = path.split(os.sep)
    if len(parts) < 2 or parts[-2] != "assets" or ".." in parts or not parts[-1] or parts[-1] in (".", ".."):
        raise PlanError(f"engine asset {path!r} is not a file directly inside a SavedModel's assets directory")
    limit = _max_asset_bytes()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:  # a symlink is ELOOP here
        raise PlanError(f"cannot open engine asset {path!r}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PlanError(f"engine asset {path!r} is not a regular file")
        if info.st_size > limit:
            raise PlanError(f"engine asset {path!r} holds {info.st_size} bytes, more than the limit of {limit} "
                            f"({MAX_ASSET_BYTES_ENV})")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PlanError(f"engine asset {path!r} grew past the limit of {limit} bytes ({MAX_ASSET_BYTES_ENV})")
    return data
