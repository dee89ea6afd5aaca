"""Builds and loads the TRTEngineOp op library from kernel.cc.

The library is compiled on first use with the C++ compiler ($CXX, else g++) against the
installed TensorFlow and Python headers, and cached per user under
``$TFTRT_PY_CACHE_DIR`` (default ``~/.cache/tftrt_py/ops``) in a folder named after the
TensorFlow version and a hash of the source and the build command, so a new TensorFlow,
Python or kernel source gets a fresh build. Builds write a temporary file next to the
final one and rename it into place, so concurrent processes are safe.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

import tensorflow as tf

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernel.cc")
LIBRARY_NAME = "tftrt_engine_op.so"
CACHE_ENV = "TFTRT_PY_CACHE_DIR"

_lock = threading.Lock()
_module = None


class OpLibraryError(RuntimeError):
    """The TRTEngineOp library could not be built or loaded."""


def _compiler() -> list[str]:
    """The compiler command: $CXX (may hold arguments, e.g. "ccache g++"), else g++."""
    env = os.environ.get("CXX", "").strip()
    cmd = shlex.split(env) if env else ["g++"]
    found = shutil.which(cmd[0])
    if found is None:
        origin = "$CXX" if env else "the default compiler"
        raise OpLibraryError(
            f"Cannot build the TRTEngineOp op library: {origin} {cmd[0]!r} was not found. "
            "Install a C++17 compiler (e.g. `apt-get install g++`) or set the CXX environment "
            "variable to one.")
    return [found, *cmd[1:]]


def _flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the op library."""
    compile_flags = ["-std=c++17", "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations",
                     *tf.sysconfig.get_compile_flags(),
                     "-I" + sysconfig.get_paths()["include"]]
    return compile_flags, list(tf.sysconfig.get_link_flags())


def library_path() -> Path:
    """Where the library for this source, compiler, flags, TensorFlow and Python lives."""
    compiler = _compiler()
    compile_flags, link_flags = _flags()
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    for part in [*compiler, *compile_flags, *link_flags, sys.version]:
        digest.update(b"\0" + part.encode())
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tftrt_py" / "ops"
    return Path(root) / f"{tf.__version__}-{digest.hexdigest()[:16]}" / LIBRARY_NAME


def _compile(path: Path) -> None:
    """Compiles kernel.cc into `path` (atomically: temp file then rename)."""
    compile_flags, link_flags = _flags()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    cmd = [*_compiler(), *compile_flags, str(SOURCE), "-o", tmp, *link_flags]
    # A first import waits 15-30 s here: say so, not only at INFO.
    logger.warning("Compiling the TRTEngineOp op library for TensorFlow %s (once per TensorFlow version; "
                   "15-30 s) into %s", tf.__version__, path)
    start = time.perf_counter()
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise OpLibraryError(f"Cannot run the C++ compiler {cmd[0]!r}: {e}. Install g++ or "
                                 "set CXX to a working C++17 compiler.") from e
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()]
            tail = "\n".join((errors or lines)[-30:])
            raise OpLibraryError(f"Compiling the TRTEngineOp op library failed (exit {proc.returncode})."
                                 f"\nCommand: {shlex.join(cmd)}\n{tail}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("Compiled the TRTEngineOp op library in %.1f s", time.perf_counter() - start)


def build() -> Path:
    """The path of the compiled library, compiling it first when it is not cached."""
    path = library_path()
    if not path.is_file():
        _compile(path)
    return path


def load():
    """The loaded op library module (with ``trt_engine_op``), built on first use; memoized."""
    global _module
    with _lock:
        if _module is None:
            path = build()
            try:
                _module = tf.load_op_library(str(path))
            except (tf.errors.OpError, OSError) as e:
                raise OpLibraryError(f"Loading the TRTEngineOp op library {path} failed: {e}") from e
        return _module


def trt_engine_op(*args, **kwargs):
    """The generated TRTEngineOp op wrapper (``load().trt_engine_op``)."""
    return load().trt_engine_op(*args, **kwargs)
