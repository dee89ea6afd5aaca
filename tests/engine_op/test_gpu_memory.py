"""TensorFlow's GPUs beside the engines: the decision from what TensorFlow reports, and applying it.

TensorFlow's GPU build cannot run on the test machines (it needs CUDA 12 libraries): tf.config is mocked.
"""
import logging

import pytest
import tensorflow as tf

from tftrt_py.engine_op import gpu_memory
from tftrt_py.engine_op.gpu_memory import (FORCE_GROWTH_ENV, GpuFacts, TensorFlowFacts, TensorFlowGpuMemoryError,
                                           decide, prepare_tensorflow_gpus)

BUDGET_ENV = "TFTRT_PY_GPU_MEMORY_BUDGET"
GPU0, GPU1 = "/physical_device:GPU:0", "/physical_device:GPU:1"
BARE = GpuFacts(GPU0, memory_growth=False, logical_devices=0)
BARE1 = GpuFacts(GPU1, memory_growth=False, logical_devices=0)
GROWING = GpuFacts(GPU0, memory_growth=True, logical_devices=0)
LIMITED = GpuFacts(GPU1, memory_growth=False, logical_devices=1)


def facts(*gpus, initialized=False, force_growth=None, budget=None):
    return TensorFlowFacts(gpus, initialized, force_growth, budget)


# (what TensorFlow reports, GPUs given memory growth, whether engine ops fail, log level)
TABLE = {
    "no TensorFlow GPUs (tensorflow-cpu)": (facts(), (), False, logging.DEBUG),
    "not initialized, not configured: growth set": (facts(BARE, BARE1), (GPU0, GPU1), False, logging.INFO),
    "user's growth and memory limit kept": (facts(GROWING, LIMITED), (), False, logging.DEBUG),
    "user's configuration kept, the bare GPU grows": (facts(BARE, LIMITED), (GPU0,), False, logging.INFO),
    "initialized with the user's configuration": (facts(GROWING, LIMITED, initialized=True), (), False,
                                                  logging.DEBUG),
    "initialized without growth or limit: error": (facts(BARE, LIMITED, initialized=True), (), True, logging.DEBUG),
    "TF_FORCE_GPU_ALLOW_GROWTH=true left alone": (facts(BARE, initialized=True, force_growth="true"), (), False,
                                                  logging.DEBUG),
    "TF_FORCE_GPU_ALLOW_GROWTH=false left alone, warned": (facts(BARE, force_growth="false"), (), False,
                                                          logging.WARNING),
    "initialized bare with a budget: trusted, warned": (facts(BARE, initialized=True, budget=1 << 30), (), False,
                                                        logging.WARNING),
}


@pytest.mark.parametrize("case", TABLE)
def test_decision_table(case):
    reported, grow, fails, level = TABLE[case]
    decision = decide(reported)
    assert decision.grow == grow
    assert (decision.error is not None) == fails
    assert decision.level == level
    assert decision.note or decision.error


def test_the_error_says_exactly_what_to_set():
    error = decide(facts(BARE, LIMITED, initialized=True)).error
    assert GPU0 in error and GPU1 not in error
    for setting in (f"{FORCE_GROWTH_ENV}=true", "tf.config.experimental.set_memory_growth(gpu, True)",
                    "tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration("
                    "memory_limit=", f"{BUDGET_ENV}=<N>MiB", "prepare_tensorflow_gpus()", "Before TensorFlow first"):
        assert setting in error


class FakeConfig:
    """tf.config's GPU functions over fake physical GPUs; set_memory_growth fails once TF is 'initialized'."""

    def __init__(self, growth=(False, False), logical=(None, None), initialized=False):
        self.gpus = [tf.config.PhysicalDevice(name, "GPU") for name in (GPU0, GPU1)[:len(growth)]]
        self.growth = dict(zip(self.gpus, growth))
        self.logical = dict(zip(self.gpus, logical))
        self.initialized = initialized

    def set_memory_growth(self, gpu, enable):
        if self.growth[gpu] == enable:
            return
        if self.initialized:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[gpu] = enable

    def install(self, monkeypatch):
        monkeypatch.setattr(gpu_memory, "_decision", None)
        monkeypatch.setattr(tf.config, "list_physical_devices",
                            lambda kind=None: list(self.gpus) if kind == "GPU" else [])
        monkeypatch.setattr(tf.config.experimental, "get_memory_growth", lambda gpu: self.growth[gpu])
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", self.set_memory_growth)
        monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda gpu: self.logical[gpu])
        return self


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    monkeypatch.delenv(FORCE_GROWTH_ENV, raising=False)
    monkeypatch.delenv(BUDGET_ENV, raising=False)
    monkeypatch.setattr(gpu_memory, "_decision", None)


def test_tensorflow_cpu_has_no_gpus_and_nothing_is_set():
    decision = prepare_tensorflow_gpus()
    assert tf.config.list_physical_devices("GPU") == []
    assert decision.grow == () and decision.error is None


def test_growth_is_set_on_gpus_tensorflow_has_not_initialized(monkeypatch, caplog):
    config = FakeConfig(growth=(False, False), logical=(None, [object()])).install(monkeypatch)
    with caplog.at_level(logging.INFO, logger=gpu_memory.__name__):
        decision = prepare_tensorflow_gpus()
    assert decision.grow == (GPU0,)
    assert list(config.growth.values()) == [True, False]  # GPU1's memory limit is the user's
    assert "enabling memory growth" in caplog.text and GPU0 in caplog.text


def test_gpus_already_initialized_fail_every_engine_op_saying_what_to_set(monkeypatch):
    config = FakeConfig(growth=(False, True), initialized=True).install(monkeypatch)
    for _ in range(2):
        with pytest.raises(TensorFlowGpuMemoryError, match=f"{FORCE_GROWTH_ENV}=true") as info:
            prepare_tensorflow_gpus()
    assert GPU0 in str(info.value) and GPU1 not in str(info.value)
    assert list(config.growth.values()) == [False, True]


def test_the_environment_switch_is_left_to_tensorflow(monkeypatch):
    config = FakeConfig(initialized=True).install(monkeypatch)
    monkeypatch.setenv(FORCE_GROWTH_ENV, "true")
    assert prepare_tensorflow_gpus().error is None
    assert list(config.growth.values()) == [False, False]


def test_a_budget_vouches_for_initialized_gpus(monkeypatch):
    FakeConfig(initialized=True).install(monkeypatch)
    monkeypatch.setenv(BUDGET_ENV, "2GiB")
    decision = prepare_tensorflow_gpus()
    assert decision.error is None and "2048 MiB" in decision.note


def test_a_malformed_budget_fails_before_anything_is_set(monkeypatch):
    config = FakeConfig().install(monkeypatch)
    monkeypatch.setenv(BUDGET_ENV, "plenty")
    with pytest.raises(ValueError, match=BUDGET_ENV):
        prepare_tensorflow_gpus()
    assert list(config.growth.values()) == [False, False]


def test_the_decision_is_kept(monkeypatch):
    config = FakeConfig().install(monkeypatch)
    first = prepare_tensorflow_gpus()
    config.initialized = True
    config.growth = dict.fromkeys(config.gpus, False)
    assert prepare_tensorflow_gpus() is first


def test_engine_ops_on_the_gpu_ask_first(monkeypatch):
    from tftrt_py.engine_op import op as engine_op

    FakeConfig(initialized=True).install(monkeypatch)
    monkeypatch.setattr(engine_op, "_backend_name", "numpy")
    assert engine_op.engine_backend() == "numpy"  # CPU engines share nothing with TensorFlow's GPUs
    monkeypatch.setattr(engine_op, "_backend_name", "cupy")
    with pytest.raises(TensorFlowGpuMemoryError, match=FORCE_GROWTH_ENV):
        engine_op.engine_backend()
