"""Raw kernels of the cupy backend (backends/cupy/kernels.py) compiled ahead, without a GPU: the kernels a program
made are compiled together in threads, on the device of the thread that asks, each once; one that fails is left to
fail where it is launched."""
import sys
import threading
import types

import pytest

from tftrt_py.engine.backends.cupy import kernels


class FakeDevice:
    """cupy.cuda.Device: the current device of each thread, set inside `with`."""

    current = threading.local()

    def __init__(self, index=None):
        self.id = getattr(FakeDevice.current, "id", 0) if index is None else index

    def __enter__(self):
        self.saved = getattr(FakeDevice.current, "id", 0)
        FakeDevice.current.id = self.id

    def __exit__(self, *exc):
        FakeDevice.current.id = self.saved


class FakeRawKernel:
    """cupy.RawKernel: records the thread and device each compile ran on."""

    def __init__(self, code, name, options=()):
        self.code, self.name, self.compiles = code, name, []

    def compile(self):
        self.compiles.append((threading.current_thread().name, FakeDevice().id))
        if "broken" in self.code:
            raise RuntimeError("nvrtc: error: broken")


@pytest.fixture()
def cupy(monkeypatch):
    fake = types.SimpleNamespace(RawKernel=FakeRawKernel, cuda=types.SimpleNamespace(Device=FakeDevice))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(kernels, "_pending", [])
    kernels.raw_kernel.cache_clear()
    yield fake
    kernels.raw_kernel.cache_clear()


def test_the_kernels_made_since_the_last_call_compile_in_threads_on_the_callers_device(cupy):
    made = [kernels.raw_kernel(f"// kernel {i}\n", f"k{i}") for i in range(6)]
    with FakeDevice(1):
        kernels.compile_pending()
    assert all(len(k.compiles) == 1 for k in made)
    assert {device for k in made for _, device in k.compiles} == {1}
    assert all(thread.startswith("tftrt-nvrtc") for k in made for thread, _ in k.compiles)
    kernels.compile_pending()  # nothing new: nothing compiles again
    assert all(len(k.compiles) == 1 for k in made)


def test_a_kernel_asked_for_again_is_the_same_kernel_and_compiles_once(cupy):
    first = kernels.raw_kernel("// same\n", "k")
    assert kernels.raw_kernel("// same\n", "k") is first
    kernels.raw_kernel("// other\n", "k")
    kernels.compile_pending()
    assert len(first.compiles) == 1


def test_a_kernel_that_does_not_compile_ahead_is_left_for_its_launch(cupy):
    broken, fine = kernels.raw_kernel("// broken\n", "b"), kernels.raw_kernel("// fine\n", "f")
    kernels.compile_pending()  # (no error here: the launch raises it, with the kernel's own message)
    assert len(broken.compiles) == 1 and len(fine.compiles) == 1


def test_a_lone_kernel_compiles_at_its_launch(cupy):
    alone = kernels.raw_kernel("// alone\n", "a")
    kernels.compile_pending()
    assert alone.compiles == []


def test_an_epilogue_told_its_shapes_makes_the_kernel_its_calls_will_launch_at_once(cupy):
    """So it compiles with its op's other kernels: a GEMM convolution's bias-and-residual epilogue, fp16 [8, 14, 14, 64]
    with a batch-of-one residual."""
    from tftrt_py.engine.backends.cupy.ops.pointwise import epilogue_op

    epilogue = epilogue_op("float16", True, True, {"type": "relu"}, (8, 14, 14, 64), (1, 14, 14, 64))
    (made,) = kernels._pending
    total = 8 * 14 * 14 * 64
    assert epilogue._variant(64, total // 8, total, aligned=True) == (made, 8)  # 16-byte accesses of 8 halves
    assert "#define RES_TOTAL 12544" in made.code and "#define VEC 8" in made.code
