"""CPU backends use as many threads as the process allows: TFTRT_PY_CPU_THREADS, then OpenMP/OpenBLAS/MKL's
variables, then TensorFlow's intra-op setting, then the CPUs the process may run on; BLAS is held to that
count while an engine runs on the numpy backend, and gets its own setting back after. Work on large arrays (weights
cast to fp16) runs in that many threads."""
import sys
import threading
import types

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

from tftrt_py.engine import Builder, Network
from tftrt_py.engine.backends import threads
from tftrt_py.engine.backends.threads import LIBRARY_ENVS, THREADS_ENV, blas_limit, cpu_threads

ENVS = (THREADS_ENV, *LIBRARY_ENVS)


def fake_tensorflow(intra_op: int):
    """A stand-in `tensorflow` module whose tf.config.threading reports `intra_op` intra-op threads."""
    threading_api = types.SimpleNamespace(get_intra_op_parallelism_threads=lambda: intra_op)
    return types.SimpleNamespace(config=types.SimpleNamespace(threading=threading_api))


@pytest.fixture
def process(monkeypatch):
    """No thread variables, no TensorFlow, 6 CPUs in the affinity mask: set what a test needs."""
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 2, 3, 5, 6, 7})
    monkeypatch.setattr(blas_limit, "_controller", None)  # the BLAS libraries loaded now (other tests load scipy's)
    return monkeypatch


def blas_threads() -> int:
    """The thread count of every BLAS library loaded (one number when they agree)."""
    (n,) = {lib["num_threads"] for lib in ThreadpoolController().select(user_api="blas").info()}
    return n


def test_affinity_mask_when_nothing_is_set(process):
    assert cpu_threads() == 6


@pytest.mark.parametrize("winner", range(len(ENVS)))
def test_each_variable_wins_over_those_after_it(process, winner):
    for i, name in enumerate(ENVS[winner:]):
        process.setenv(name, str(i + 2))
    process.setitem(sys.modules, "tensorflow", fake_tensorflow(9))
    assert cpu_threads() == 2


@pytest.mark.parametrize("value", ["0", "-3", "many", " "])
def test_invalid_values_are_skipped(process, value):
    process.setenv(THREADS_ENV, value)
    process.setenv("MKL_NUM_THREADS", "3")
    assert cpu_threads() == 3


def test_openmp_nested_list_gives_its_outer_level(process):
    process.setenv("OMP_NUM_THREADS", "4,2")
    assert cpu_threads() == 4


def test_tensorflow_intra_op_setting_when_imported_and_set(process):
    process.setitem(sys.modules, "tensorflow", fake_tensorflow(3))
    assert cpu_threads() == 3


def test_tensorflow_left_at_its_default_gives_the_affinity_mask(process):
    process.setitem(sys.modules, "tensorflow", fake_tensorflow(0))  # 0: TensorFlow picks
    assert cpu_threads() == 6


def test_tensorflow_is_never_imported(process):
    cpu_threads()
    assert "tensorflow" not in sys.modules


def matmul_engine():
    rng = np.random.default_rng(0)
    net = Network("matmul")
    x = net.add_input("x", "float32", (64, 96))
    weight = rng.standard_normal((96, 48)).astype("float32")
    net.mark_output(net.add_layer("MatrixMultiply", [x, net.add_constant(weight)]).outputs[0])
    return Builder().build_engine(net), weight


class Recording:
    """Wraps a backend: notes BLAS's thread count as each layer runs."""

    def __init__(self, backend):
        self.backend, self.seen = backend, []

    def run_layer(self, layer, args):
        self.seen.append(blas_threads())
        return self.backend.run_layer(layer, args)


@pytest.mark.parametrize("allowed", [1, 2])
def test_blas_is_held_to_the_count_while_an_engine_runs(process, allowed):
    engine, weight = matmul_engine()
    ctx = engine.create_execution_context()
    ctx.backend = recording = Recording(ctx.backend)
    process.setenv(THREADS_ENV, str(allowed))
    x = np.random.default_rng(1).standard_normal((64, 96)).astype("float32")
    with ThreadpoolController().limit(limits=3, user_api="blas"):  # BLAS's own setting, other than both
        out = ctx.execute_v2([x])[0]
        assert blas_threads() == 3
    assert recording.seen and set(recording.seen) == {allowed}
    np.testing.assert_allclose(out, x @ weight, rtol=1e-5, atol=1e-5)


def test_overlapping_runs_share_one_limit_restored_by_the_last(process):
    with ThreadpoolController().limit(limits=3, user_api="blas"):
        first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
        seen = {}

        def second():
            first_in.wait()
            with blas_limit(2):
                second_in.set()
                first_out.wait()
                seen["after first left"] = blas_threads()

        worker = threading.Thread(target=second)
        worker.start()
        with blas_limit(1):
            first_in.set()
            second_in.wait()
            seen["both in"] = blas_threads()
        first_out.set()
        worker.join()
        assert seen == {"both in": 1, "after first left": 1}
        assert blas_threads() == 3


def test_an_older_threadpoolctl_still_caps_from_the_running_thread(process, monkeypatch):
    """threadpoolctl < 3.8 (installed beside us, as on some images) has no clear_controlling_thread: engines still
    run, capped from the thread that runs them."""
    from threadpoolctl import OpenBLASController

    monkeypatch.delattr(OpenBLASController, "clear_controlling_thread", raising=False)
    engine, weight = matmul_engine()
    x = np.random.default_rng(2).standard_normal((8, 96)).astype("float32")
    with blas_limit(1):
        out = engine.create_execution_context().execute_v2([x])[0]
    np.testing.assert_allclose(out, x @ weight, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("nbytes, threaded", [(threads.PARALLEL_BYTES, False), (threads.PARALLEL_BYTES + 1, True)])
def test_array_work_runs_in_threads_only_above_its_size_and_keeps_the_order(monkeypatch, nbytes, threaded):
    monkeypatch.setattr(threads, "cpu_threads", lambda: 3)
    ran_on = []

    def work(i):
        ran_on.append(threading.current_thread().name)
        return i * i

    assert threads.map_arrays(work, list(range(7)), nbytes, "tftrt-test") == [i * i for i in range(7)]
    assert all(name.startswith("tftrt-test") for name in ran_on) == threaded
    assert threaded or set(ran_on) == {threading.current_thread().name}
