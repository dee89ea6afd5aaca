"""The processes a GPU build compiles ahead in, started before their work is known
(engine/backends/cupy/helper_processes.py): a helper started ahead is handed out before a new one starts, one about
to stop waiting is not, those not taken end when released, and a helper given nothing, or nothing for STANDBY_S,
ends with no work."""
from __future__ import annotations

import json
import os

import pytest

from tftrt_py.engine.backends.cupy import helper_processes

MODULE = "echo_helper"  # tests/engine/echo_helper.py


@pytest.fixture(autouse=True)
def no_helpers_left(monkeypatch):
    monkeypatch.setattr(helper_processes, "_waiting", {})
    yield
    helper_processes.release(MODULE)


def answer(proc) -> dict:
    out = proc.stdout.read()
    assert proc.wait(60) == 0
    return json.loads(out)


def test_a_helper_started_ahead_is_handed_out_and_does_the_work_given():
    helper_processes.stand_by(MODULE, 2)
    ahead = [proc for proc, _ in helper_processes._waiting[MODULE]]
    first, second, third = (helper_processes.take(MODULE) for _ in range(3))
    assert [first, second] == ahead and third not in ahead  # the third started when asked for
    for n, proc in enumerate((first, second, third)):
        helper_processes.give(proc, json.dumps([n, "conv"]).encode())
        assert answer(proc) == {"work": [n, "conv"]}


def test_standing_by_again_starts_only_the_helpers_missing():
    helper_processes.stand_by(MODULE, 1)
    helper_processes.stand_by(MODULE, 2)
    assert len(helper_processes._waiting[MODULE]) == 2


def test_helpers_not_taken_end_with_no_work_when_released():
    helper_processes.stand_by(MODULE, 2)
    procs = [proc for proc, _ in helper_processes._waiting[MODULE]]
    helper_processes.release(MODULE)
    assert [answer(proc) for proc in procs] == [{"work": None}] * 2 and MODULE not in helper_processes._waiting


def test_a_helper_about_to_stop_waiting_is_ended_and_a_new_one_started(monkeypatch):
    helper_processes.stand_by(MODULE, 1)
    (stale, started), = helper_processes._waiting[MODULE]
    helper_processes._waiting[MODULE] = [(stale, started - helper_processes.STANDBY_S + helper_processes.MARGIN_S / 2)]
    fresh = helper_processes.take(MODULE)
    assert fresh is not stale and answer(stale) == {"work": None}
    helper_processes.give(fresh, b"[]")
    assert answer(fresh) == {"work": []}


def test_a_helper_waits_standby_s_for_work_at_most(monkeypatch):
    read, write = os.pipe()
    monkeypatch.setattr(helper_processes, "STANDBY_S", 0.05)
    with os.fdopen(read) as stdin, os.fdopen(write, "w") as parent:
        monkeypatch.setattr(helper_processes.sys, "stdin", stdin)
        assert helper_processes.wait_for_work() is None  # nothing written: it stops waiting
        parent.write('{"specs": [1]}')
        parent.close()
        assert helper_processes.wait_for_work() == {"specs": [1]}
