"""The op library: a cached build is verified by its digest before loading (a damaged one is rebuilt, never
loaded), a library prebuilt elsewhere loads on a machine without a compiler ($TFTRT_PY_OP_LIBRARY), a hanging
compiler is killed after $TFTRT_PY_COMPILE_TIMEOUT, and an unusable cache dir is one clear error.

Fake compilers copy the real library or hang, so no test here compiles."""
import hashlib
import logging
import os
import subprocess
import sys
import time

import pytest

from support import subprocess_env
from tftrt_py.engine_op import library

NAME = library.LIBRARY_NAME


@pytest.fixture(scope="module")
def real_library():
    return library.build()


@pytest.fixture
def cache(tmp_path, monkeypatch, real_library):
    """A fresh cache dir whose "compiler" copies the real library (one line per compile in `cache / "compiles"`)."""
    cxx = tmp_path / "copy-cxx"
    cxx.write_text(f'#!/bin/sh\necho x >> "{tmp_path}/compiles"\nwhile [ "$1" != "-o" ]; do shift; done\n'
                   f'cp "{real_library}" "$2"\n')
    cxx.chmod(0o755)
    env = {library.CACHE_ENV: str(tmp_path / "cache"), "CXX": str(cxx)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def compiles(cache):
    path = os.path.join(os.path.dirname(cache["CXX"]), "compiles")
    return len(open(path).readlines()) if os.path.exists(path) else 0


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_build_records_its_sha256_next_to_it(cache, real_library):
    path = library.build()
    assert path.read_bytes() == real_library.read_bytes()
    assert library.digest_path(path).read_text() == f"{sha256(path)}  {NAME}\n"  # sha256sum's format
    assert library.build() == path and compiles(cache) == 1


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:4096]),
    "bytes flipped": lambda p: flip(p, len(p.read_bytes()) // 2),
    "header flipped": lambda p: flip(p, 0),
    "digest missing": lambda p: library.digest_path(p).unlink(),
    "digest empty": lambda p: library.digest_path(p).write_text(""),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_cached_library_is_rebuilt(cache, damage, caplog):
    path = library.build()
    good = path.read_bytes()
    damage(path)
    with caplog.at_level(logging.WARNING, logger=library.__name__):
        assert library.build() == path
    assert compiles(cache) == 2 and path.read_bytes() == good and library._damage(path) is None
    assert any(f"The cached TRTEngineOp op library {path} is damaged" in r.getMessage() for r in caplog.records)


def python(*args, **env):
    """Run a fresh Python with `args`; its stdout and stderr."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=subprocess_env(**env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


RUN_AN_ENGINE_OP = """
import tensorflow as tf
from tftrt_py.engine_op import library
ops = library.load()
seg = tf.function(lambda x: x * 2 + 1, autograph=False).get_concrete_function(tf.TensorSpec([None], tf.float32))
f = tf.function(lambda x: ops.trt_engine_op([x], [], OutT=[tf.float32], segment_func=seg))
print(f(tf.constant([1.0, 2.0]))[0].numpy().tolist())
"""


def test_import_rebuilds_a_damaged_cached_library_instead_of_loading_it(cache):
    path = library.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(library.build().read_bytes())  # a real build...
    flip(path, 2000)  # ...damaged after its digest was written
    out, err = python("-c", RUN_AN_ENGINE_OP, **cache)
    assert out.splitlines()[-1] == "[3.0, 5.0]"
    assert f"The cached TRTEngineOp op library {path} is damaged" in err and compiles(cache) == 2


def test_a_library_prebuilt_by_the_cli_loads_without_a_compiler(cache, tmp_path, capsys):
    library.main(["--build", "--out", str(tmp_path / "image")])  # python -m tftrt_py.engine_op.library ...
    prebuilt = tmp_path / "image" / NAME
    assert capsys.readouterr().out == f"{library.PREBUILT_ENV}={prebuilt}\n"
    assert library.digest_path(prebuilt).read_text() == f"{sha256(prebuilt)}  {NAME}\n"
    serving = {library.PREBUILT_ENV: str(prebuilt), "CXX": str(tmp_path / "no-such-g++"),
               library.CACHE_ENV: str(tmp_path / "serving-cache")}
    out, _ = python("-c", RUN_AN_ENGINE_OP, **serving)
    assert out.splitlines()[-1] == "[3.0, 5.0]"
    assert not (tmp_path / "serving-cache").exists()  # nothing compiled, nothing cached


def retagged(data: bytes, old: str, new: str) -> bytes:
    tag = data.index(library.TAG_MARKER)
    return data[:tag] + data[tag:].replace(old.encode(), new.encode(), 1)


PREBUILT = {  # how the prebuilt library is wrong -> what the error says
    "missing": (lambda lib, p: None, "is not a file"),
    "damaged": (lambda lib, p: (p.write_bytes(lib.read_bytes()[:-100]),
                                library.digest_path(p).write_text(f"{sha256(lib)}  {NAME}\n")),
                "is damaged: its SHA-256 is .* its digest file says"),
    "untagged": (lambda lib, p: p.write_bytes(b"\x7fELF not ours"), "built for an unknown installation"),
    "for another TensorFlow": (lambda lib, p: p.write_bytes(retagged(lib.read_bytes(), "tensorflow=", "tensorflow=9.")),
                               "built for tensorflow=9.*; this installation needs tensorflow="),
}


@pytest.mark.parametrize("make, error", PREBUILT.values(), ids=PREBUILT.keys())
def test_a_wrong_prebuilt_library_is_refused(real_library, tmp_path, monkeypatch, make, error):
    path = tmp_path / NAME
    make(real_library, path)
    monkeypatch.setenv(library.PREBUILT_ENV, str(path))
    with pytest.raises(library.OpLibraryError, match=f"{library.PREBUILT_ENV}=.*{error}"):
        library.prebuilt()


def test_a_prebuilt_library_without_a_digest_file_is_checked_by_its_tag(real_library, tmp_path, monkeypatch):
    path = tmp_path / NAME
    path.write_bytes(real_library.read_bytes())
    monkeypatch.setenv(library.PREBUILT_ENV, str(path))
    assert library.prebuilt() == path


@pytest.fixture
def hanging_compiler(tmp_path, monkeypatch):
    """A "compiler" whose child sleeps for a minute (as a hung cc1plus under g++ would)."""
    cxx = tmp_path / "hanging-cxx"
    cxx.write_text("#!/bin/sh\nsleep 60\n")
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "cache"))
    return cxx


def test_a_hanging_compiler_is_killed_after_the_timeout(hanging_compiler, monkeypatch):
    monkeypatch.setenv(library.TIMEOUT_ENV, "0.5")
    start = time.perf_counter()
    with pytest.raises(library.OpLibraryError) as info:
        library.build()
    assert time.perf_counter() - start < 10  # the sleeping child was killed too: nothing held its pipes open
    message = str(info.value)
    assert "\n" not in message and "did not finish within 0.5 s" in message
    assert library.TIMEOUT_ENV in message and library.PREBUILT_ENV in message
    assert [p.name for p in library.library_path().parent.iterdir()] == [NAME + ".lock"]  # no temp file left


def test_the_compile_timeout_defaults_to_300_s_and_reads_its_env(monkeypatch):
    monkeypatch.delenv(library.TIMEOUT_ENV, raising=False)
    assert library.compile_timeout() == library.DEFAULT_COMPILE_TIMEOUT == 300
    monkeypatch.setenv(library.TIMEOUT_ENV, "900")
    assert library.compile_timeout() == 900


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan"])
def test_a_bad_compile_timeout_names_its_env_var(hanging_compiler, monkeypatch, value):
    monkeypatch.setenv(library.TIMEOUT_ENV, value)
    with pytest.raises(library.OpLibraryError, match=f"^{library.TIMEOUT_ENV}='{value}' is not a positive number "
                                                     f"of seconds; set it to one"):
        library.build()


def test_a_cache_dir_under_a_regular_file_names_the_cache_env_var(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "file" / "cache"))
    with pytest.raises(library.OpLibraryError) as info:
        library.build()
    message = str(info.value)
    assert "\n" not in message and message.startswith("Cannot create the op library cache")
    assert f"({library.CACHE_ENV}={tmp_path / 'file' / 'cache'}): Not a directory" in message
    assert message.endswith(f"set {library.CACHE_ENV} to a writable directory")
