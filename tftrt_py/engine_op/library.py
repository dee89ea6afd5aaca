"""Builds, verifies and loads the TRTEngineOp op library from kernel.cc.

The library is compiled on first use with the C++ compiler ($CXX, else g++) against the installed TensorFlow
and Python headers, and cached per user under ``$TFTRT_PY_CACHE_DIR`` (default ``~/.cache/tftrt_py/ops``) in a
folder named after the TensorFlow version and a hash of the build flags, which carry the build tag (TensorFlow,
Python and kernel source versions), so a new TensorFlow, Python or kernel source gets a fresh build. A build is
published atomically with its SHA-256 in ``<library>.sha256`` (sha256sum's format); a cached library whose
digest is missing or differs is damaged: it is logged and rebuilt, never loaded. A compile that runs longer than
``$TFTRT_PY_COMPILE_TIMEOUT`` seconds (default 300) is killed and raises OpLibraryError, so a hanging compiler
cannot block ``import`` forever.

``$TFTRT_PY_OP_LIBRARY`` names a prebuilt library to load instead, on machines without a compiler: it must
match its digest file when one lies next to it and carry this installation's build tag.
``python -m tftrt_py.engine_op.library --build --out DIR`` prebuilds one (library and digest) into DIR.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import tensorflow as tf

from tftrt_py import settings
from tftrt_py.engine_op import lifetime

logger = logging.getLogger(__name__)

__all__ = ["OpLibraryError", "build", "build_tag", "compile_timeout", "library_path", "load", "prebuilt",
           "trt_engine_op"]

SOURCE = Path(__file__).with_name("kernel.cc")
LIBRARY_NAME = "tftrt_engine_op.so"
CACHE_ENV = settings.CACHE_DIR.name
PREBUILT_ENV = settings.OP_LIBRARY.name
TIMEOUT_ENV = settings.COMPILE_TIMEOUT.name
#: Seconds a compile may take (it takes 15-30 s) before it is killed; $TFTRT_PY_COMPILE_TIMEOUT overrides it.
DEFAULT_COMPILE_TIMEOUT = settings.COMPILE_TIMEOUT.default
TAG_MARKER = b"tftrt_py-build-tag:"  # kernel.cc's tftrt_py_build_tag starts with it

_lock = threading.Lock()
_module = None


class OpLibraryError(RuntimeError):
    """The TRTEngineOp library could not be built or loaded."""


def build_tag() -> str:
    """What a library must be built for to load here: TensorFlow, Python and the kernel source."""
    kernel = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"tensorflow={tf.__version__};python={sys.version_info[0]}.{sys.version_info[1]};kernel={kernel}"


def _compiler() -> list[str]:
    """The compiler command: $CXX (may hold arguments, e.g. "ccache g++"), else g++."""
    env = settings.CXX.raw()
    cmd = shlex.split(env) if env else ["g++"]
    found = shutil.which(cmd[0])
    if found is None:
        origin = "$CXX" if env else "the default compiler"
        raise OpLibraryError(
            f"Cannot build the TRTEngineOp op library: {origin} {cmd[0]!r} was not found. "
            "Install a C++17 compiler (e.g. `apt-get install g++`) or set the CXX environment variable to one, "
            f"or set {PREBUILT_ENV} to a library prebuilt for this installation "
            "(`python -m tftrt_py.engine_op.library --build --out DIR` on a machine with a compiler).")
    return [found, *cmd[1:]]


def compile_timeout() -> float:
    """Seconds a compile may run: $TFTRT_PY_COMPILE_TIMEOUT, else DEFAULT_COMPILE_TIMEOUT."""
    try:
        return settings.COMPILE_TIMEOUT.get()
    except settings.SettingError as exc:
        raise OpLibraryError(f"{exc}; set it to one (default {DEFAULT_COMPILE_TIMEOUT:g}) or unset it") from None


def _flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for the op library."""
    compile_flags = ["-std=c++17", "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations",
                     f'-DTFTRT_PY_BUILD_TAG="{build_tag()}"', *tf.sysconfig.get_compile_flags(),
                     "-I" + sysconfig.get_paths()["include"]]
    return compile_flags, list(tf.sysconfig.get_link_flags())


def library_path() -> Path:
    """Where the library for these flags (source, TensorFlow and Python included) lives; needs no compiler."""
    compile_flags, link_flags = _flags()
    digest = hashlib.sha256()
    for part in [*compile_flags, *link_flags, sys.version]:
        digest.update(b"\0" + part.encode())
    root = settings.CACHE_DIR.raw() or Path.home() / ".cache" / "tftrt_py" / "ops"
    return Path(root) / f"{tf.__version__}-{digest.hexdigest()[:16]}" / LIBRARY_NAME


def digest_path(library: Path) -> Path:
    """The file holding `library`'s SHA-256."""
    return library.with_name(library.name + ".sha256")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _damage(library: Path) -> Optional[str]:
    """Why `library` cannot be trusted (missing, no digest, digest differs), or None."""
    if not library.is_file():
        return "it is missing"
    try:
        recorded = digest_path(library).read_text().split()[0]
    except (OSError, IndexError):
        return f"its digest file {digest_path(library).name} is missing or empty"
    actual = _sha256(library)
    return None if actual == recorded else f"its SHA-256 is {actual[:16]}..., its digest file says {recorded[:16]}..."


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # readable by the serving user (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def _build_lock(path: Path):
    """One build of `path` at a time across processes."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(path.name + ".lock"), "w")
    except OSError as e:
        origin = f"{CACHE_ENV}={settings.CACHE_DIR.raw()}" if settings.CACHE_DIR.raw() else "the default"
        raise OpLibraryError(f"Cannot create the op library cache {path.parent} ({origin}): {e.strerror or e}; "
                             f"set {CACHE_ENV} to a writable directory") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run_compiler(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """Runs `cmd` in its own process group; past `timeout` seconds the whole group is killed (the compiler
    driver's children too, which would otherwise hold its output pipes open)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as e:
        raise OpLibraryError(f"Cannot run the C++ compiler {cmd[0]!r}: {e}. Install g++ or "
                             "set CXX to a working C++17 compiler.") from e
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise OpLibraryError(
            f"Compiling the TRTEngineOp op library with {cmd[0]!r} did not finish within {timeout:g} s and was "
            f"killed: check the compiler ($CXX), raise {TIMEOUT_ENV}, or set {PREBUILT_ENV} to a prebuilt "
            "library (`python -m tftrt_py.engine_op.library --build --out DIR`)") from None
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _compile(path: Path) -> None:
    """Compiles kernel.cc into `path`, then writes its digest (each atomically: temp file then rename)."""
    compile_flags, link_flags = _flags()
    timeout = compile_timeout()
    fd, tmp = tempfile.mkstemp(prefix=f".{LIBRARY_NAME}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    cmd = [*_compiler(), *compile_flags, str(SOURCE), "-o", tmp, *link_flags]
    # A first import waits 15-30 s here: say so, not only at INFO.
    logger.warning("Compiling the TRTEngineOp op library for TensorFlow %s (once per TensorFlow version; "
                   "15-30 s) into %s", tf.__version__, path)
    start = time.perf_counter()
    try:
        proc = _run_compiler(cmd, timeout)
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()]
            tail = "\n".join((errors or lines)[-30:])
            raise OpLibraryError(f"Compiling the TRTEngineOp op library failed (exit {proc.returncode})."
                                 f"\nCommand: {shlex.join(cmd)}\n{tail}")
        digest = _sha256(Path(tmp))
        os.replace(tmp, path)
        _write_atomically(digest_path(path), f"{digest}  {path.name}\n".encode())
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("Compiled the TRTEngineOp op library in %.1f s", time.perf_counter() - start)


def build() -> Path:
    """The path of the cached library, compiling it first when it is missing or damaged."""
    path = library_path()
    if _damage(path) is None:
        return path
    with _build_lock(path):
        damage = _damage(path)
        if damage is None:  # another process built it meanwhile
            return path
        if path.exists():
            logger.warning("The cached TRTEngineOp op library %s is damaged (%s): rebuilding it", path, damage)
        _compile(path)
    return path


def _tag(library: Path) -> Optional[str]:
    """The build tag compiled into `library`, or None."""
    data = library.read_bytes()
    start = data.find(TAG_MARKER)
    if start < 0:
        return None
    start += len(TAG_MARKER)
    return data[start:data.find(b"\0", start)].decode(errors="replace")


def prebuilt() -> Optional[Path]:
    """The library $TFTRT_PY_OP_LIBRARY names, checked against its digest file (if any) and build tag."""
    name = settings.OP_LIBRARY.raw()
    if not name:
        return None
    path = Path(name)
    if not path.is_file():
        raise OpLibraryError(f"{PREBUILT_ENV}={name} is not a file")
    if digest_path(path).exists() and (damage := _damage(path)):
        raise OpLibraryError(f"{PREBUILT_ENV}={name} is damaged: {damage}")
    tag, wanted = _tag(path), build_tag()
    if tag != wanted:
        raise OpLibraryError(f"{PREBUILT_ENV}={name} was built for {tag or 'an unknown installation'}; this "
                             f"installation needs {wanted}: rebuild it with "
                             "`python -m tftrt_py.engine_op.library --build --out DIR`")
    return path


#: What makes XLA's Max and Min on the CPU propagate NaN, as TensorFlow's kernels do (XLA ignores NaN there otherwise).
NAN_MIN_MAX = "--xla_cpu_enable_fast_min_max=false"


def load():
    """The loaded op library module (with ``trt_engine_op``), built on first use; memoized."""
    global _module
    with _lock:
        if _module is None:
            settings.XLA_FLAGS.add_flag(NAN_MIN_MAX)  # before the process's first XLA compile (loops compiled by XLA)
            path = prebuilt() or build()
            try:
                _module = tf.load_op_library(str(path))
            except (tf.errors.OpError, OSError) as e:
                raise OpLibraryError(f"Loading the TRTEngineOp op library {path} failed: {e}") from e
            lifetime.install()
        return _module


def trt_engine_op(*args, **kwargs):
    """The generated TRTEngineOp op wrapper (``load().trt_engine_op``)."""
    return load().trt_engine_op(*args, **kwargs)


def main(argv=None) -> None:
    """Prebuild the library (for images without a compiler): prints where it and its digest are."""
    parser = argparse.ArgumentParser(prog="python -m tftrt_py.engine_op.library", description=main.__doc__)
    parser.add_argument("--build", action="store_true", required=True, help="build (or find) the cached library")
    parser.add_argument("--out", type=Path, help=f"also copy the library and its digest into this folder "
                                                 f"(point {PREBUILT_ENV} at the copy)")
    args = parser.parse_args(argv)
    path = build()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        for src in (path, digest_path(path)):
            _write_atomically(args.out / src.name, src.read_bytes())
        path = args.out / path.name
    print(f"{PREBUILT_ENV}={path}")


if __name__ == "__main__":
    main()
