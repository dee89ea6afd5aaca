"""The control channel between a front-end worker process and the model process: one duplex connection (a unix
socket pair) carrying small messages; each message is a pickled list of items (tuples whose first element names
the kind). A sender thread sends whatever is queued in one message, so a busy channel costs one system call per
batch of items, not one per item; items sent lazily (counters, freed blocks) wait for the next message, at
most LAZY_SECONDS. Tensors do not travel here: shared_tensors' arenas hold them.

A message is unpickled with only the classes messages hold (builtins, numpy arrays and dtypes, signature defs, and the
classes tftrt_py.serving's modules define): a worker parses untrusted requests, and what it sends must not be able
to make the model process call anything else."""
from __future__ import annotations

import io
import logging
import pickle
import queue
import threading
from multiprocessing.connection import Connection
from typing import Callable, List, Union

logger = logging.getLogger(__name__)

__all__ = ["Link", "LAZY_SECONDS"]

LAZY_SECONDS = 0.02  # how long an item sent lazily may wait for a message to ride with
_CLOSE = object()

#: an item, or a function computing it (or a list of items) on the sender thread, so that encoding answers is not
#: the caller's work
Item = Union[tuple, Callable[[], Union[tuple, List[tuple]]]]


#: (module, name) of the other globals a message may name: numpy's array and dtype reconstruction, the signature
#: defs of the version table
_GLOBALS = {(m, n) for m in ("numpy._core.multiarray", "numpy.core.multiarray") for n in ("_reconstruct", "scalar")} \
    | {("numpy", "ndarray"), ("numpy", "dtype"), ("builtins", "set"), ("builtins", "frozenset"),
       ("tensorflow.core.protobuf.meta_graph_pb2", "SignatureDef")}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _GLOBALS:
            return super().find_class(module, name)
        if module.startswith("tftrt_py.serving.") and "." not in name:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:  # defined there, not imported
                return found
        raise pickle.UnpicklingError(f"a link message may not name {module}.{name}")


def decode(data: bytes) -> list:
    """A message's items (pickle.UnpicklingError for one naming anything but what messages hold)."""
    return _Unpickler(io.BytesIO(data)).load()


class Link:
    """Items to and from the other process over `conn`; send() and send_lazily() are thread-safe, receive() is
    called by one thread. With `direct`, send() sends from the calling thread (one message per item, no hand-off
    to the sender thread, which then only sends the lazy items): for callers that send one item at a time from a
    busy event loop, where waking another thread for the GIL costs more than the system call."""

    def __init__(self, conn: Connection, name: str, direct: bool = False):
        self.conn, self.name, self.direct = conn, name, direct
        self._sending = threading.Lock()  # one message on the connection at a time
        self._broken = False
        self._queue: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self._lazy: List[Item] = []
        self._lazy_lock = threading.Lock()
        self._thread = threading.Thread(target=self._send_loop, name=f"{name}-send", daemon=True)
        self._thread.start()

    def send(self, item: Item) -> None:
        """Send `item` (or what the function `item` returns) soon, after the items sent lazily before it."""
        if self.direct:
            with self._lazy_lock:
                items, self._lazy = self._lazy, []
            items.append(item)
            self._write(items)
        else:
            self._queue.put(item)

    def send_lazily(self, item: Item) -> None:
        """Send `item` with the next message, or within LAZY_SECONDS."""
        with self._lazy_lock:
            self._lazy.append(item)

    def receive(self) -> List[tuple]:
        """The items of the next message (EOFError once the other side closed or died)."""
        return decode(self.conn.recv_bytes())

    def close(self) -> None:
        """Send what is queued, stop the sender thread, close the connection."""
        self._queue.put(_CLOSE)
        self._thread.join()
        self.conn.close()

    def _take(self) -> tuple:
        """(items to send now, closing?): the lazy items first, then everything queued."""
        try:
            first = self._queue.get(timeout=LAZY_SECONDS)
        except queue.Empty:
            first = None
        with self._lazy_lock:
            items, self._lazy = self._lazy, []
        pending = [] if first is None else [first]
        while True:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        closing = any(p is _CLOSE for p in pending)
        if closing:
            pending = pending[:pending.index(_CLOSE)]
        return items + pending, closing

    def _write(self, items: List[Item]) -> None:
        with self._sending:
            if self._broken:
                return
            try:
                message = []
                for item in items:
                    value = item() if callable(item) else item
                    message.extend(value) if isinstance(value, list) else message.append(value)
                self.conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
            except (OSError, EOFError, ValueError):  # the other process is gone: what follows is dropped
                self._broken = True
            except Exception:
                logger.exception("%s: a message could not be sent", self.name)

    def _send_loop(self) -> None:
        while True:
            items, closing = self._take()
            if items:
                self._write(items)
            if closing:
                return
