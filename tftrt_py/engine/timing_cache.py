"""A timing cache (TensorRT's ITimingCache): which tactic won the timing of a layer, kept across builds and processes.

The GPU backend looks each layer up before timing its candidates and records the winner, so a later build (another
engine with the same layers, another process) rebuilds the recorded tactic instead of timing again. A key names what
the choice depends on: the layer's signature (kind, shapes, dtypes, params), the build options that change the
candidates, and the GPU with the versions of the libraries whose kernels were timed. Entries of other GPUs or
versions stay in the file, unused.

The file is JSON data only (no code, no native plans), parsed against a schema where it enters: a file that is too
large, malformed or not a timing cache is ignored with one warning and never overwritten. Saving is atomic and
merges what other processes saved meanwhile. ``TFTRT_PY_TIMING_CACHE`` names the process's default cache file.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import logging
import math
import os
import stat
import tempfile
import threading
from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Union

from tftrt_py import settings

try:
    import fcntl
except ImportError:  # not POSIX: saves still merge, without a lock between processes
    fcntl = None

__all__ = ["TimingCache", "TimingKey", "TimingCacheError", "default_timing_cache", "default_path", "using",
           "for_build", "FORMAT", "VERSION", "MAX_BYTES"]

logger = logging.getLogger(__name__)

FORMAT = "tftrt_py timing cache"
VERSION = 1
#: Bounds of what a cache file may hold: bytes, entries, characters of a string, items of a tactic's lists and
#: dicts, and their nesting.
MAX_BYTES = 64 << 20
MAX_ENTRIES = 200_000
MAX_TEXT = 64 << 10
MAX_ITEMS = 4096
MAX_DEPTH = 8

_SCALARS = (type(None), bool, int, float, str)


class TimingCacheError(ValueError):
    """Data that is not a timing cache this version reads (the message says what is wrong)."""


class TimingKey(NamedTuple):
    """What a tactic choice depends on: the layer's signature, the build options that change its candidates and the
    GPU with its library versions (the last two as canonical JSON objects of scalars)."""

    layer: str
    options: str
    device: str

    @classmethod
    def of(cls, layer: str, options: Mapping[str, object], device: Mapping[str, object]) -> "TimingKey":
        """The key of `layer` (a signature string) built with `options` on `device`; TimingCacheError where a part
        is not a string or a flat mapping of strings to scalars."""
        _text(layer, "layer")
        return cls(layer, _canonical(_flat(options, "options")), _canonical(_flat(device, "device")))


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


# -- the schema ------------------------------------------------------------------------------------------------------
def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise TimingCacheError(f"{what} is a {type(value).__name__}, not a string")
    if len(value) > MAX_TEXT:
        raise TimingCacheError(f"{what} is longer than {MAX_TEXT} characters")
    return value


def _number(value, what: str):
    if isinstance(value, float) and not math.isfinite(value):
        raise TimingCacheError(f"{what} is {value}, not a finite number")
    return value


def _flat(value, what: str) -> dict:
    """`value` as a dict when it maps strings to scalars (None, bools, numbers, strings)."""
    if not isinstance(value, Mapping) or len(value) > MAX_ITEMS:
        raise TimingCacheError(f"{what} is not a mapping of at most {MAX_ITEMS} items")
    for k, v in value.items():
        _text(k, f"a key of {what}")
        if not isinstance(v, _SCALARS):
            raise TimingCacheError(f"{what}[{k!r}] is a {type(v).__name__}, not a scalar")
        if isinstance(v, str):
            _text(v, f"{what}[{k!r}]")
        else:
            _number(v, f"{what}[{k!r}]")
    return dict(value)


def _plain(value, what: str, depth: int = 0) -> None:
    """Raise TimingCacheError unless `value` is JSON data (dicts with string keys, lists, scalars) within bounds."""
    if depth > MAX_DEPTH:
        raise TimingCacheError(f"{what} nests deeper than {MAX_DEPTH}")
    if isinstance(value, str):
        _text(value, what)
    elif isinstance(value, _SCALARS):
        _number(value, what)
    elif isinstance(value, (list, dict)):
        if len(value) > MAX_ITEMS:
            raise TimingCacheError(f"{what} holds more than {MAX_ITEMS} items")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if isinstance(value, dict):
                _text(k, f"a key of {what}")
            _plain(v, f"{what}[{k!r}]", depth + 1)
    else:
        raise TimingCacheError(f"{what} is a {type(value).__name__}, not JSON data")


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a timing cache holds")


def _parse(data: bytes) -> Dict[TimingKey, dict]:
    """The entries of a serialized cache; TimingCacheError naming the first problem."""
    if len(data) > MAX_BYTES:
        raise TimingCacheError(f"{len(data)} bytes, more than the {MAX_BYTES} a timing cache may hold")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TimingCacheError(f"not JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TimingCacheError(f"not a {FORMAT} (no \"format\": {FORMAT!r})")
    if set(doc) != {"format", "version", "entries"}:
        raise TimingCacheError(f"fields {sorted(doc)}; a timing cache has format, version and entries")
    version = doc["version"]
    if type(version) is not int or version != VERSION:
        raise TimingCacheError(f"format version {version!r}; this tftrt_py reads version {VERSION}")
    entries = doc["entries"]
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        raise TimingCacheError(f"\"entries\" is not a list of at most {MAX_ENTRIES} entries")
    found: Dict[TimingKey, dict] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) != {"layer", "options", "device", "tactic"}:
            raise TimingCacheError(f"entry {i} is not an object of layer, options, device and tactic")
        key = TimingKey.of(entry["layer"], entry["options"], entry["device"])
        if not isinstance(entry["tactic"], dict):
            raise TimingCacheError(f"entry {i}'s tactic is not an object")
        _plain(entry["tactic"], f"entry {i}'s tactic")
        found[key] = entry["tactic"]
    return found


def _dump(entries: Mapping[TimingKey, dict]) -> bytes:
    doc = {"format": FORMAT, "version": VERSION,
           "entries": [{"layer": k.layer, "options": json.loads(k.options), "device": json.loads(k.device),
                        "tactic": v} for k, v in sorted(entries.items())]}
    return json.dumps(doc, sort_keys=True, indent=1, allow_nan=False).encode()


# -- files -----------------------------------------------------------------------------------------------------------
def _read(path: str) -> Dict[TimingKey, dict]:
    """The entries of the cache file at `path`, none where there is no file; TimingCacheError where it is not a
    valid cache (OSError where it cannot be read)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return {}
    if not stat.S_ISREG(info.st_mode):
        raise TimingCacheError("not a regular file")
    if info.st_size > MAX_BYTES:
        raise TimingCacheError(f"{info.st_size} bytes, more than the {MAX_BYTES} a timing cache may hold")
    with open(path, "rb") as f:
        return _parse(f.read(MAX_BYTES + 1))


_warned = set()
_warned_lock = threading.Lock()


def _warn_unusable(path: str, exc: Exception) -> None:
    """Say once per path that the file there is not used (and never replaced)."""
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    logger.warning("timing cache %s is not usable (%s): tactics are timed without it and the file is left as it "
                   "is; delete it, or point TFTRT_PY_TIMING_CACHE elsewhere", path, exc)


@contextlib.contextmanager
def _exclusive(path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``path + ".lock"`` between processes (where the OS has fcntl)."""
    if fcntl is None:
        yield
        return
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def _write_atomically(path: str, data: bytes) -> None:
    """Replace `path` by `data` in one step: readers see the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- the cache -------------------------------------------------------------------------------------------------------
class TimingCache:
    """Tactic records (plain JSON data) by :class:`TimingKey`; thread-safe. ``TimingCache()`` is an empty cache in
    memory, :meth:`load` reads one from a file it can :meth:`save` back to."""

    def __init__(self, path: Optional[str] = None):
        self.path = os.path.abspath(os.path.expanduser(path)) if path else None
        self._entries: Dict[TimingKey, dict] = {}
        self._recorded = set()  # keys recorded since the last save
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TimingCache(path={self.path!r}, entries={len(self)})"

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @classmethod
    def load(cls, path: str) -> "TimingCache":
        """The cache saved at `path` (empty where there is no file yet; saved back there by :meth:`save`). A file
        that is not a valid cache is ignored with one warning."""
        cache = cls(path)
        try:
            cache._entries = _read(cache.path)
        except (TimingCacheError, OSError) as exc:
            _warn_unusable(cache.path, exc)
        return cache

    @classmethod
    def deserialize(cls, data: bytes) -> "TimingCache":
        """A cache in memory from :meth:`serialize`'s bytes; TimingCacheError saying what is wrong with them."""
        cache = cls()
        cache._entries = _parse(bytes(data))
        return cache

    def serialize(self) -> bytes:
        """Every entry (other GPUs' too) as the JSON bytes a cache file holds."""
        with self._lock:
            return _dump(self._entries)

    def devices(self) -> List[dict]:
        """The devices its entries were timed on (GPU and library versions, as TimingKey.of took them), each once."""
        with self._lock:
            found = {key.device for key in self._entries}
        return [json.loads(device) for device in sorted(found)]

    def lookup(self, key: TimingKey) -> Optional[dict]:
        """A copy of the tactic recorded for `key`, or None."""
        with self._lock:
            found = self._entries.get(key)
            return copy.deepcopy(found) if found is not None else None

    def record(self, key: TimingKey, tactic: Mapping) -> None:
        """Record `tactic` (JSON data: tuples become lists) as the choice for `key`; TimingCacheError where it is not
        JSON data within the file's bounds."""
        if not isinstance(key, TimingKey):
            raise TimingCacheError(f"a timing cache key is a TimingKey, not a {type(key).__name__}")
        try:
            value = json.loads(json.dumps(dict(tactic), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise TimingCacheError(f"tactic {tactic!r} is not JSON data ({exc})") from None
        _plain(value, "the tactic")
        with self._lock:
            if self._entries.get(key) != value:
                self._entries[key] = value
                self._recorded.add(key)

    @property
    def unsaved(self) -> bool:
        """Whether entries were recorded since this cache was loaded or last saved."""
        with self._lock:
            return bool(self._recorded)

    def save(self, path: Optional[str] = None) -> bool:
        """Write the cache to `path` (default: the file it was loaded from) in one atomic step, merged with what
        the file holds now (saves of other processes; this cache's own records win for the same key), and take
        those entries in. False, with one warning, where the file there is not a timing cache: it is left alone.
        OSError where the file cannot be written."""
        target = os.path.abspath(os.path.expanduser(path)) if path else self.path
        if target is None:
            raise ValueError("this timing cache has no file: save(path)")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with self._lock, _exclusive(target):
            try:
                on_disk = _read(target)
            except TimingCacheError as exc:
                _warn_unusable(target, exc)
                return False
            merged = {**self._entries, **on_disk, **{k: self._entries[k] for k in self._recorded}}
            data = _dump(merged)
            if len(data) > MAX_BYTES:
                logger.warning("timing cache %s would hold %d bytes, more than %d: not saved; delete it to start "
                               "afresh", target, len(data), MAX_BYTES)
                return False
            _write_atomically(target, data)
            self._entries = merged
            self._recorded.clear()
        return True


# -- the process's caches --------------------------------------------------------------------------------------------
_defaults: Dict[str, TimingCache] = {}
_defaults_lock = threading.Lock()


def default_path() -> Optional[str]:
    """The file ``TFTRT_PY_TIMING_CACHE`` names (``~/.cache/tftrt_py/timing_cache.json`` when unset), None when it
    turns the cache off."""
    path = settings.TIMING_CACHE.get()
    return os.path.abspath(os.path.expanduser(path)) if path else None


def default_timing_cache() -> Optional[TimingCache]:
    """The process's cache at :func:`default_path` (loaded once per path), or None when the setting turns it off."""
    path = default_path()
    if path is None:
        return None
    with _defaults_lock:
        if path not in _defaults:
            _defaults[path] = TimingCache.load(path)
        return _defaults[path]


#: The cache of the build in progress in this context (see :func:`using`).
_building: contextvars.ContextVar = contextvars.ContextVar("tftrt_py_timing_cache", default=None)


@contextlib.contextmanager
def using(cache: Union[None, bool, TimingCache]) -> Iterator[None]:
    """Engines built in this block (this thread or task) use `cache`: a TimingCache, False for none, None for the
    process's default (``BuilderConfig.timing_cache`` reaches the backend this way; it is never part of a plan)."""
    token = _building.set(cache)
    try:
        yield
    finally:
        _building.reset(token)


def for_build() -> Optional[TimingCache]:
    """The cache an engine build reads and fills: the one :func:`using` names, else the process's default."""
    chosen = _building.get()
    if chosen is False:
        return None
    return chosen if isinstance(chosen, TimingCache) else default_timing_cache()
