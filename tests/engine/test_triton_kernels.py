"""Triton kernels compiled ahead of time (cupy backend's triton package), without a GPU or Triton: a build's
compile process answers in JSON lines, which are read as data only, and a kernel it does not deliver is compiled
where it is needed."""
import base64
import concurrent.futures
import io
import json

import pytest

from tftrt_py.engine.backends.cupy import triton as kernels

REQUEST = ("some.module", "kernel", (("x", "*i8"),), (("BM", 64),), (), 4, 3, 90)


class FakeProcess:
    """What prefetch reads from: the compile process's stdout."""

    def __init__(self, lines):
        self.stdout = io.BytesIO("".join(line + "\n" for line in lines).encode())

    def wait(self):
        return 0


def answer(index, cubin=b"\x7fELF", name="kernel", warps=4, shared=1024, params=9):
    return json.dumps({"index": index, "artifacts": [base64.b64encode(cubin).decode(), name, warps, shared, params]})


def collect(lines, n=2):
    futures = [concurrent.futures.Future() for _ in range(n)]
    kernels._collect(FakeProcess(lines), futures)
    return futures


def test_answers_become_the_kernels_artifacts():
    first, second = collect([answer(1, shared=2048), answer(0)])
    assert first.result() == (b"\x7fELF", "kernel", 4, 1024, 9)
    assert second.result()[3] == 2048


def test_a_kernel_that_did_not_compile_reports_why():
    (future,) = collect([json.dumps({"index": 0, "error": "CompilationError: at 3:4"})], n=1)
    with pytest.raises(RuntimeError, match="CompilationError"):
        future.result()


@pytest.mark.parametrize("line", ["not json", json.dumps({"index": 7, "error": "x"}),
                                  json.dumps({"index": 0, "artifacts": ["!!", "k"]}), json.dumps([1, 2])])
def test_an_unreadable_answer_ends_the_collection_and_the_rest_compile_here(line):
    futures = collect([line, answer(1)])
    assert all(f.done() for f in futures)
    assert isinstance(futures[0].exception(), RuntimeError)


def test_a_kernel_the_process_did_not_deliver_is_compiled_here(monkeypatch):
    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("the Triton compile process ended without this kernel"))
    monkeypatch.setitem(kernels._PREFETCHED, REQUEST, failed)
    monkeypatch.setattr(kernels, "artifacts", lambda request: (b"cubin", "kernel", 8, 0, 9))
    kernels._compile.cache_clear()
    try:
        kernel = kernels.compile_kernel(REQUEST)
    finally:
        kernels._compile.cache_clear()
    assert (kernel.cubin, kernel.threads, kernel.params) == (b"cubin", 256, 9)


def test_requests_are_hashable_and_order_independent():
    a = kernels.request("m", "f", {"x": "*i8", "n": "i32"}, {"B": 1, "A": 2}, 90, ("n",), 4, 3)
    b = kernels.request("m", "f", {"n": "i32", "x": "*i8"}, {"A": 2, "B": 1}, 90, ["n"], 4, 3)
    assert a == b and hash(a) == hash(b)
    assert json.loads(json.dumps(a))[2] == [["n", "i32"], ["x", "*i8"]]  # what the compile process receives


def geom(c, kernel=(3, 3)):
    from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom

    return ConvGeom(8, (14, 14), c, 64, kernel, 1, (1, 1), (1, 1), (1, 1), (1, 1), (14, 14))


@pytest.mark.parametrize("c, bk", [(256, 128), (128, 128), (64, 64), (96, 32), (4, 128)])
def test_a_convolution_steps_through_the_tiles_bk_channels_where_they_divide_them(c, bk):
    from tftrt_py.engine.backends.cupy.ops import triton_conv

    tile = (128, 128, 128, 4, 3)
    assert triton_conv.kernel_tile(geom(c), tile) == (128, 128, bk, 4, 3)
    request = triton_conv.kernel_request("INT8", geom(c), True, True, None, False, "int8", False, tile, 90)
    assert dict(request[3])["BK"] == bk and request[5:7] == (4, 3)
