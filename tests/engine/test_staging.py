"""Host arrays reach the device through pinned buffers in chunks (cupy backend's staging; no GPU needed here:
a fake device array records what the DMA would carry)."""
import numpy as np
import pytest

from tftrt_py.engine.backends.cupy import staging


class FakeDevice:
    """A device array: `set` copies a host array in (as cupy's ndarray.set) and records the chunk sizes."""

    def __init__(self, shape, dtype, log=None):
        self.data = np.zeros(shape, dtype)
        self.log = [] if log is None else log

    def reshape(self, *shape):
        view = FakeDevice.__new__(FakeDevice)
        view.data, view.log = self.data.reshape(*shape), self.log
        return view

    def __getitem__(self, key):
        view = FakeDevice.__new__(FakeDevice)
        view.data, view.log = self.data[key], self.log
        return view

    def set(self, host, stream=None):
        assert host.shape == self.data.shape
        self.data[...] = host
        self.log.append(host.size)


@pytest.fixture(params=["1", "4"], ids=["caller thread", "4 workers"])
def threads(request, monkeypatch):
    monkeypatch.setenv(staging.THREADS_ENV, request.param)
    monkeypatch.setattr(staging, "_pool", None)
    yield int(request.param)
    monkeypatch.setattr(staging, "_pool", None)


@pytest.mark.parametrize("shape", [(3, 5), (9, 1000, 97)])
def test_to_device_carries_every_byte(threads, shape):
    src = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    pinned, device = np.empty_like(src), FakeDevice(shape, np.float32)
    staging.to_device(src, pinned, device, stream=None)
    np.testing.assert_array_equal(device.data, src)
    chunks = -(-src.nbytes // staging.CHUNK_BYTES)
    assert len(device.log) == (chunks if threads > 1 and src.nbytes > staging.CHUNK_BYTES else 1)


def test_to_device_takes_non_contiguous_inputs(threads):
    src = np.random.default_rng(1).standard_normal((600, 1200)).astype(np.float32)[:, ::2]
    pinned, device = np.empty(src.shape, np.float32), FakeDevice(src.shape, np.float32)
    staging.to_device(src, pinned, device, stream=None)
    np.testing.assert_array_equal(device.data, src)


@pytest.mark.parametrize("size", [7, 3_000_000])
def test_from_pinned_writes_into_the_callers_buffer_or_a_new_array(threads, size):
    out = np.random.default_rng(2).standard_normal(size).astype(np.float32)
    given = {}

    def allocate(index, shape):
        given[index] = np.empty(shape, np.float32)
        return given[index]
    got = staging.from_pinned(out, 0, allocate)
    assert got is given[0]
    np.testing.assert_array_equal(got, out)
    fresh = staging.from_pinned(out, 0, None)
    assert fresh is not out and not np.shares_memory(fresh, out)
    np.testing.assert_array_equal(fresh, out)


@pytest.mark.parametrize("value, want", [("3", 3), ("0", None), ("many", None), ("", None)])
def test_copy_threads_from_the_environment(monkeypatch, value, want):
    import os

    monkeypatch.setenv(staging.THREADS_ENV, value)
    assert staging.copy_threads() == (want or min(4, len(os.sched_getaffinity(0))))


def test_scalars_keep_their_shape(threads):
    src = np.array(2.5, np.float32)
    pinned, device = np.empty((), np.float32), FakeDevice((), np.float32)
    staging.to_device(src, pinned, device, stream=None)
    assert device.data.shape == () and device.data == 2.5
    assert staging.from_pinned(pinned, 0, None).shape == ()
