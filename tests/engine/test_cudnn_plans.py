"""Which cuDNN plans a convolution graph builds for timing (cupy backend; no GPU needed: a fake cuDNN graph lists
plans with their behaviour notes and records which ones get built)."""
import threading
import types

import pytest

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops import BuildOptions
from tftrt_py.engine.backends.cupy.ops.conv import CudnnConvGraph

RUNTIME = "RUNTIME_COMPILATION"


class FakeGraph:
    """A cuDNN graph whose plans are `kinds` in heuristics order: "rt" runtime-compiled, "pre" precompiled,
    "rt-bad" runtime-compiled but failing to build."""

    def __init__(self, kinds):
        self.kinds, self.built = kinds, []

    def get_execution_plan_count(self):
        return len(self.kinds)

    def get_behavior_notes_for_plan_at_index(self, i):
        return [RUNTIME] if self.kinds[i].startswith("rt") else []

    def build_plan_at_index(self, i):
        if self.kinds[i] == "rt-bad":
            raise RuntimeError("not supported")
        self.built.append(i)

    def get_plan_name_at_index(self, i):
        return f"eng{i}"

    def get_workspace_size_plan_at_index(self, i):
        return 0


@pytest.fixture(autouse=True)
def fake_cudnn(monkeypatch):
    module = types.SimpleNamespace(behavior_note=types.SimpleNamespace(RUNTIME_COMPILATION=RUNTIME))
    monkeypatch.setattr(_device, "cudnn_module", lambda: module)


def graph(*kinds) -> CudnnConvGraph:
    g = CudnnConvGraph.__new__(CudnnConvGraph)
    g.lock, g.graph, g.built, g.failed = threading.Lock(), FakeGraph(kinds), {}, set()
    return g


def indices(plans):
    return [i for i, _, _ in plans]


def test_one_runtime_compiled_plan_then_the_next_precompiled_one():
    g = graph("rt", "rt", "rt", "pre", "pre")
    assert indices(g.plans(2, runtime_limit=1)) == [0, 3]
    assert g.graph.built == [0, 3]  # the skipped runtime plans were never compiled


def test_without_a_runtime_limit_the_first_plans_are_built():
    g = graph("rt", "rt", "pre")
    assert indices(g.plans(2)) == [0, 1]


def test_a_failed_runtime_plan_does_not_use_up_the_runtime_limit():
    g = graph("pre", "rt-bad", "rt", "pre")
    assert indices(g.plans(3, runtime_limit=1)) == [0, 2, 3]


def test_runtime_limit_zero_keeps_precompiled_plans_only():
    g = graph("rt", "pre", "rt", "pre")
    assert indices(g.plans(2, runtime_limit=0)) == [1, 3]


def test_only_runtime_compiled_plans_give_one():
    g = graph("rt", "rt", "rt")
    assert indices(g.plans(2, runtime_limit=1)) == [0]


def test_a_recorded_plan_is_built_whatever_its_kind():
    g = graph("pre", "rt", "rt")
    assert indices(g.plans(2, prefer="eng2", runtime_limit=0)) == [2]


def test_the_backend_times_at_most_one_runtime_compiled_plan_per_convolution_by_default():
    assert BuildOptions().cudnn_runtime_plans == 1
    assert BuildOptions().cudnn_plans == 2
