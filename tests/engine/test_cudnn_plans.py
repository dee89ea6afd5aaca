"""Which cuDNN plans a convolution graph builds for timing, and which it loads from another process's offer instead
(cupy backend; no GPU needed: a fake cuDNN graph lists plans with their behaviour notes and records which ones get
built, a fake frontend records what is deserialized and run)."""
import threading
import types

import pytest

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops import BuildOptions
from tftrt_py.engine.backends.cupy.ops import conv
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


class FakeTensor:
    def __init__(self, uid):
        self.uid = uid

    def get_uid(self):
        return self.uid


class Deserialized:
    """What the fake frontend's pygraph(handle) gives: records the blob it loads and the packs it runs."""

    def __init__(self, handle):
        self.handle, self.data, self.runs = handle, None, []

    def deserialize(self, handle, data):
        if data == b"corrupt":
            raise RuntimeError("CUDNN_STATUS_BAD_PARAM")
        self.data = data

    def get_workspace_size(self):
        return 256

    def execute(self, pack, workspace, handle):
        self.runs.append((pack, workspace, handle))


@pytest.fixture(autouse=True)
def fake_cudnn(monkeypatch):
    module = types.SimpleNamespace(behavior_note=types.SimpleNamespace(RUNTIME_COMPILATION=RUNTIME),
                                   pygraph=lambda handle: Deserialized(handle))
    monkeypatch.setattr(_device, "cudnn_module", lambda: module)


def graph(*kinds, key=None) -> CudnnConvGraph:
    g = CudnnConvGraph.__new__(CudnnConvGraph)
    g.lock = threading.Lock()
    g._adopt(FakeGraph(kinds), handle="handle")
    g.key, g.X, g.W, g.Y = key, FakeTensor(1), FakeTensor(2), FakeTensor(6)
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


UIDS = {"X": 1, "W": 2, "Y": 6}


def test_an_offered_runtime_plan_is_deserialized_not_compiled():
    g = graph("rt", "pre", key="conv-a")
    conv.offer_plan("conv-a", 0, conv.PlanOffer("eng0", 128, UIDS, b"plan"))
    assert g.plans(2, runtime_limit=1) == [(0, "eng0", 256), (1, "eng1", 0)]  # the larger of the two workspaces
    assert g.graph.built == [1] and g.loaded[0].data == b"plan"


def test_an_offered_plan_runs_with_the_pointers_bound_by_uid():
    g = graph("rt", key="conv-b")
    conv.offer_plan("conv-b", 0, conv.PlanOffer("eng0", 0, UIDS, b"plan"))
    g.plans(1)
    g.execute(0, {g.X: 100, g.W: 200, g.Y: 300}, 7, "stream handle")
    assert g.loaded[0].runs == [({1: 100, 2: 200, 6: 300}, 7, "stream handle")]


@pytest.mark.parametrize("offer", [conv.PlanOffer("eng0", 0, {"X": 1, "W": 3, "Y": 6}, b"plan"),  # other uids
                                   conv.PlanOffer("eng0", 0, UIDS, b"corrupt")])  # cuDNN refuses it
def test_an_offer_that_does_not_fit_leaves_the_plan_to_be_built(offer):
    g = graph("rt", key="conv-c")
    conv.offer_plan("conv-c", 0, offer)
    assert indices(g.plans(1)) == [0]
    assert g.graph.built == [0] and g.loaded == {}


def test_an_offer_for_another_graph_or_plan_is_not_taken():
    g = graph("rt", "rt", key="conv-d")
    conv.offer_plan("conv-other", 0, conv.PlanOffer("eng0", 0, UIDS, b"plan"))
    conv.offer_plan("conv-d", 1, conv.PlanOffer("eng1", 0, UIDS, b"plan"))
    assert indices(g.plans(1)) == [0]
    assert g.graph.built == [0] and g.loaded == {}
