"""A conversion stage's garbage collections look only at the objects the stage made: those made before it are set
aside (gc.freeze) for its duration and put back after, even when it fails; a process that froze objects itself
keeps them frozen."""
import gc
import weakref

import pytest

from tftrt_py.converters.memory import collecting_new_objects, release_freed_memory


class Node:
    pass


def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


@pytest.fixture(autouse=True)
def nothing_frozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_older_objects_are_set_aside_during_the_stage_and_its_own_garbage_is_collected():
    older = cycle()
    seen = {}

    @collecting_new_objects
    def stage():
        seen["frozen"] = gc.get_freeze_count()
        made = weakref.ref(cycle())  # unreachable at once, but in a reference cycle
        release_freed_memory()
        seen["collected"] = made() is None
        return "done"

    assert stage() == "done"
    assert seen == {"frozen": seen["frozen"], "collected": True} and seen["frozen"] > 0
    assert gc.get_freeze_count() == 0 and older.other.other is older


def test_the_older_objects_are_put_back_when_the_stage_fails():
    @collecting_new_objects
    def stage():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        stage()
    assert gc.get_freeze_count() == 0


def test_objects_the_process_froze_itself_stay_frozen():
    gc.freeze()
    frozen = gc.get_freeze_count()

    @collecting_new_objects
    def stage():
        return gc.get_freeze_count()

    assert stage() >= frozen
    assert gc.get_freeze_count() >= frozen > 0
