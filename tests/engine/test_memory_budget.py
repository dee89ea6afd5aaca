"""TFTRT_PY_GPU_MEMORY_BUDGET: the device bytes engine ops of a process may hold together.

The accounting is pure Python: ledgers allocate through a fake cupy memory pool here.
"""
import gc
import threading

import pytest

from tftrt_py.engine.backends.cupy import memory
from tftrt_py.engine.backends.cupy.memory import BUDGET_ENV, Budget, Ledger, OutOfGpuMemory, parse_bytes

MiB = 1 << 20


@pytest.mark.parametrize("text, size", [
    ("1073741824", 1 << 30), ("4GiB", 4 << 30), ("512MiB", 512 * MiB), ("512 mib", 512 * MiB), (" 2KiB ", 2048),
    ("1.5GB", 1_500_000_000), ("0.5GiB", 1 << 29), ("3TB", 3 * 10**12), ("100B", 100)])
def test_sizes_are_bytes_or_numbers_with_a_unit(text, size):
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "lots", "4XB", "-1", "0", "0MiB", "4 GiB 2", "1e9"])
def test_a_malformed_size_names_the_variable_and_the_form(text):
    with pytest.raises(ValueError, match=f"{BUDGET_ENV}=.*512MiB"):
        parse_bytes(text)


def test_the_budget_comes_from_the_environment():
    assert Budget.from_setting(None).limit is None
    assert Budget.from_setting("  ").limit is None
    assert Budget.from_setting("64MiB").limit == 64 * MiB
    with pytest.raises(ValueError, match=BUDGET_ENV):
        Budget.from_setting("64 apples")


def test_the_process_budget_is_read_once(monkeypatch):
    monkeypatch.setattr(memory, "_process", None)
    monkeypatch.setenv(BUDGET_ENV, "3MiB")
    budget = memory.process_budget()
    monkeypatch.setenv(BUDGET_ENV, "5MiB")
    assert memory.process_budget() is budget and budget.limit == 3 * MiB
    assert Ledger("e").budget is budget


def test_charges_and_refunds_count_up_to_the_limit():
    budget = Budget(10 * MiB)
    budget.charge(6 * MiB, "weights")
    budget.charge(4 * MiB, "activations")
    assert (budget.held, budget.peak) == (10 * MiB, 10 * MiB)
    budget.refund(4 * MiB)
    budget.charge(3 * MiB, "io")
    assert (budget.held, budget.peak) == (9 * MiB, 10 * MiB)


def test_passing_the_limit_raises_naming_the_budget_and_the_variable():
    budget = Budget.from_setting("8MiB")
    budget.charge(5 * MiB, "weights")
    with pytest.raises(OutOfGpuMemory) as info:
        budget.charge(4 * MiB, "activations of engine 'TRTEngineOp_000_000'")
    text = str(info.value)
    assert f"{BUDGET_ENV}=8MiB" in text and "activations of engine 'TRTEngineOp_000_000'" in text
    assert "4.0 MiB" in text and "5.0 MiB of the 8.0 MiB" in text
    assert budget.held == 5 * MiB  # the refused bytes were not counted


def test_no_limit_refuses_nothing():
    budget = Budget()
    budget.charge(1 << 50, "weights")
    assert budget.held == 1 << 50


class FakeOutOfMemory(Exception):
    pass


class FakeCupy:
    """A cupy stand-in whose memory pool hands out integers (counting what it gave) or fails."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.given = []

    def get_default_memory_pool(self):
        return self

    def malloc(self, nbytes):
        if self.fail:
            raise FakeOutOfMemory("out of memory allocating")
        self.given.append(nbytes)
        return nbytes


@pytest.fixture
def fake_cupy(monkeypatch):
    cupy = FakeCupy()
    monkeypatch.setattr(memory._device, "require", lambda: cupy)
    monkeypatch.setattr(memory._device, "is_out_of_memory", lambda exc: isinstance(exc, FakeOutOfMemory))
    monkeypatch.setattr(memory._device, "free_and_total", lambda: (1 * MiB, 80 * 1024 * MiB))
    return cupy


def test_ledgers_of_all_engines_charge_one_budget(fake_cupy):
    budget = Budget(10 * MiB)
    a, b = Ledger("a", budget), Ledger("b", budget)
    a.alloc("activations", 4 * MiB)
    b.alloc("io", 3 * MiB)
    b.charge("weights", 2 * MiB)
    assert budget.held == 9 * MiB
    assert a.report()["total"] == 4 * MiB and b.report()["total"] == 5 * MiB
    with pytest.raises(OutOfGpuMemory, match=f"workspace of engine 'a'.*{BUDGET_ENV}"):
        a.alloc("workspace", 2 * MiB)
    assert fake_cupy.given == [4 * MiB, 3 * MiB]  # refused before allocating
    a.release("activations", 4 * MiB)
    a.alloc("workspace", 2 * MiB)
    assert budget.held == 7 * MiB and a.report()["workspace"] == 2 * MiB


def test_an_allocation_is_charged_at_least_one_byte_as_callers_refund_it(fake_cupy):
    budget = Budget()
    ledger = Ledger("e", budget)
    ledger.alloc("io", 0)
    ledger.release("io", 1)
    assert fake_cupy.given == [1] and budget.held == 0 and ledger.report()["io"] == 0


def test_a_failed_allocation_is_refunded_and_named(fake_cupy):
    fake_cupy.fail = True
    budget = Budget(100 * MiB)
    ledger = Ledger("conv", budget)
    with pytest.raises(OutOfGpuMemory, match="out of GPU memory allocating 8.0 MiB of activations for engine 'conv'"):
        ledger.alloc("activations", 8 * MiB)
    assert budget.held == 0 and ledger.report()["total"] == 0


def test_a_ledger_that_goes_returns_what_it_held(fake_cupy):
    budget = Budget(10 * MiB)
    ledger = Ledger("evicted", budget)
    ledger.charge("weights", 6 * MiB)
    ledger.alloc("activations", 2 * MiB)
    ledger.release("activations", 2 * MiB)
    assert budget.held == 6 * MiB
    del ledger
    gc.collect()
    assert budget.held == 0
    Ledger("next", budget).charge("weights", 10 * MiB)


def test_concurrent_charges_never_pass_the_limit_and_balance():
    budget = Budget(10 * MiB)
    refused = []

    def work():
        for _ in range(2000):
            try:
                budget.charge(MiB, "io")
            except OutOfGpuMemory:
                refused.append(1)
                continue
            budget.refund(MiB)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.held == 0 and 0 < budget.peak <= 10 * MiB


def test_concurrent_ledgers_balance(fake_cupy):
    budget = Budget()
    ledgers = [Ledger(f"e{i}", budget) for i in range(4)]

    def work(ledger):
        for n in range(1, 1001):
            ledger.alloc("workspace", n)
            ledger.release("workspace", n)

    threads = [threading.Thread(target=work, args=(ledgers[i % 4],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert budget.held == 0 and all(ledger.report()["total"] == 0 for ledger in ledgers)


@pytest.mark.gpu
@pytest.mark.skipif(not memory._device.probe()[0], reason="needs an NVIDIA GPU with cupy")
def test_engines_on_the_gpu_stay_within_the_budget(monkeypatch):
    import numpy as np

    from networks import conv_relu_pool_net
    from tftrt_py.engine import Builder, BuilderConfig, BuildError, Engine, RuntimeExecutionError
    from tftrt_py.engine.backends import get_backend

    def run(engine):
        x = np.random.default_rng(3).standard_normal((4, 8, 8, 3)).astype(np.float32)
        reference = Engine(conv_relu_pool_net(), backend="numpy").create_execution_context()
        ctx = engine.create_execution_context()
        got, want = ctx.execute({"TensorRTInputPH_0": x}), reference.execute({"TensorRTInputPH_0": x})
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4)
        return ctx

    memory._device.cudnn_module()  # first (logged, cached): its log record would keep the building frames alive
    budget = Budget(1 << 30)
    monkeypatch.setattr(memory, "_process", budget)
    engine = Builder(BuilderConfig(backend="cupy")).build_engine(conv_relu_pool_net())
    ctx = run(engine)
    assert budget.held == get_backend("cupy").memory_report(engine)["total"] > 0
    del engine, ctx
    gc.collect()
    assert budget.held == 0  # the engine's weights and its context's buffers went back

    monkeypatch.setattr(memory, "_process", Budget(16 * MiB))  # less than one context's cuBLAS workspace
    with pytest.raises((BuildError, RuntimeExecutionError), match=f"{BUDGET_ENV}=16777216"):
        run(Builder(BuilderConfig(backend="cupy")).build_engine(conv_relu_pool_net()))
