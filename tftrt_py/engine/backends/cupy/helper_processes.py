"""The helper processes a GPU build compiles ahead in (cudnn_warmup's workers, the Triton compile process), started
before their work is known where a conversion will soon need them.

A helper is a Python module of this package run as ``__main__``: it starts (an interpreter, its imports, for
cudnn_warmup a CUDA context with its cuDNN and cuBLAS handles), then reads its work, one JSON document, from its
stdin, which the parent writes and closes (:func:`give`), and answers in JSON lines on its stdout. Starting one takes
2-3 s on an H200 machine's CPU, which a calibrating conversion spends loading and segmenting its model anyway: it
asks for helpers when it starts (:func:`stand_by`), and the anticipation of its first INT8 build, seconds later,
finds them waiting (:func:`take`). A helper waits for its work STANDBY_S at most (:func:`wait_for_work`), so one no
build took (every tactic in the timing cache, no convolution) gives its CUDA context back soon; a new one is
started where no helper waits, and those the first build did not take end then (:func:`release`).
"""
from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import Dict, List, Tuple

__all__ = ["stand_by", "take", "release", "give", "wait_for_work", "STANDBY_S"]

logger = logging.getLogger(__name__)

#: Seconds a helper started ahead waits for its work before it ends (a calibrating conversion's first
#: anticipation comes after its model is loaded and segmented: 2-4 s for ResNet-50 on an H200 machine), and the
#: margin within which take() starts a new one instead.
STANDBY_S = 60.0
MARGIN_S = 10.0

_lock = threading.Lock()
_waiting: Dict[str, List[Tuple[subprocess.Popen, float]]] = {}  # module -> (helper, started) not yet given work


def _start(module: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this process's imports
    return subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)


def stand_by(module: str, count: int) -> None:
    """Start helpers running `module` until `count` wait for work (fewer where processes cannot start)."""
    with _lock:
        waiting = _waiting.setdefault(module, [])
        waiting[:] = [(proc, started) for proc, started in waiting if proc.poll() is None]
        try:
            while len(waiting) < count:
                waiting.append((_start(module), time.monotonic()))
        except OSError as exc:
            logger.debug("could not start a %s helper ahead: %s", module, exc)


def take(module: str) -> subprocess.Popen:
    """A helper running `module`, for :func:`give`: one started ahead that still waits (and will for a few
    seconds more), else a new one (OSError where none can start)."""
    with _lock:
        waiting = _waiting.get(module, [])
        while waiting:
            proc, started = waiting.pop(0)
            if proc.poll() is None and time.monotonic() - started < STANDBY_S - MARGIN_S:
                return proc
            give(proc, b"")
    return _start(module)


def release(module: str) -> None:
    """End the helpers running `module` that wait for work: the first build's anticipation took what it needed,
    and each holds a CUDA context or a compiler's memory."""
    with _lock:
        waiting = _waiting.pop(module, [])
    for proc, _ in waiting:
        give(proc, b"")


def give(proc: subprocess.Popen, work: bytes) -> None:
    """Write `work` (a JSON document; empty: none) to the helper and close its stdin (OSError where it ended
    meanwhile)."""
    try:
        proc.stdin.write(work)
    finally:
        try:
            proc.stdin.close()
        except OSError:  # (the write raised already: the helper's end of the pipe is gone)
            pass


def wait_for_work():
    """In a helper: its work, read from stdin once the parent gives it; None where STANDBY_S pass first or the
    parent gives none."""
    readable, _, _ = select.select([sys.stdin], [], [], STANDBY_S)
    if not readable:
        return None
    text = sys.stdin.read()
    return json.loads(text) if text.strip() else None
