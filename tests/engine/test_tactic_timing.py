"""How the cupy tuner times candidates (tactics.Tuner._rounds, fake timers, no GPU): after an idle spell it keeps
the GPU busy before timing, then times every candidate in interleaved rounds and keeps each one's median, so a
clock still rising does not favour the candidates timed last; operands are random values made on the host."""
import time
from types import SimpleNamespace
from unittest.mock import MagicMock

import numpy as np
import pytest

from tftrt_py.engine.backends.cupy import tactics
from tftrt_py.engine.backends.cupy.tactics import Tuner


class RampingGpu:
    """Runs take `cost` ms times a slowdown that falls from 3x to 1x over the first WARM_UP_MS of GPU work."""

    def __init__(self):
        self.busy_ms, self.calls = 0.0, []

    def timer(self, name, cost, fail_at=None):
        def run():
            self.calls.append(name)
            if fail_at is not None and self.calls.count(name) >= fail_at:
                raise RuntimeError("launch failed")
            ms = cost * (1 + 2 * max(0.0, 1 - self.busy_ms / tactics.WARM_UP_MS))
            self.busy_ms += ms * tactics.INNER  # a timer replays INNER runs
            return ms
        return SimpleNamespace(tactic={"op": name}), run


def test_after_an_idle_spell_the_gpu_warms_up_and_the_fastest_wins():
    gpu = RampingGpu()
    timers = [gpu.timer("fast", 1.0), gpu.timer("middle", 1.1), gpu.timer("slow", 1.2)]
    alive = Tuner(rc=None, options=None)._rounds(timers)
    assert min(alive, key=lambda pair: pair[0].ms)[0].tactic == {"op": "fast"}
    assert [op.ms for op, _ in alive] == pytest.approx([1.0, 1.1, 1.2])
    assert gpu.busy_ms >= tactics.WARM_UP_MS


def test_candidates_are_timed_in_interleaved_rounds_and_a_failing_one_is_dropped():
    gpu = RampingGpu()
    gpu.busy_ms = tactics.WARM_UP_MS  # already at full clocks
    tuner = Tuner(rc=None, options=None)
    tuner._busy_at = time.monotonic()  # busy a moment ago: no warm-up
    timers = [gpu.timer("a", 1.0), gpu.timer("b", 2.0, fail_at=3), gpu.timer("c", 0.5)]
    alive = tuner._rounds(timers)
    assert gpu.calls[:6] == ["a", "b", "c", "a", "b", "c"]
    assert gpu.calls.count("a") == gpu.calls.count("c") == tactics.ROUNDS
    assert [op.tactic["op"] for op, _ in alive] == ["a", "c"]


@pytest.mark.parametrize("dtype, low, high", [("float32", -1, 1), ("float16", -1, 1), ("int8", -127, 127)])
def test_candidates_time_on_random_operands_made_on_the_host(dtype, low, high):
    block = tactics._random_block(dtype)
    assert block.dtype == dtype and block.size == tactics.RANDOM_BLOCK
    assert low <= block.min() < 0 < block.max() <= high
    assert len(np.unique(block)) > 100  # not a constant, nor a few values


def test_fp8_operands_are_e4m3_codes_of_both_signs_without_nan():
    codes = tactics._random_block("uint8")
    assert not np.isin(codes, [0x7f, 0xff]).any()  # E4M3's NaNs
    assert (codes >= 0x80).any() and (codes < 0x80).any()


def test_the_kernels_made_so_far_compile_together_before_a_candidate_first_runs(monkeypatch):
    """Candidates make their raw kernels when built; cupy would compile each alone at its first launch."""
    events = []
    monkeypatch.setattr(tactics.kernels, "compile_pending", lambda: events.append("compile pending"))
    fake_cupy = SimpleNamespace(cuda=SimpleNamespace(Event=object))
    monkeypatch.setattr(tactics._device, "require", lambda: fake_cupy)
    op = SimpleNamespace(capturable=False, run=lambda rc, ins, outs: events.append("run"))
    Tuner(rc=SimpleNamespace(stream=MagicMock()), options=None)._timer(op, [], [])
    assert events == ["compile pending", "run"]
