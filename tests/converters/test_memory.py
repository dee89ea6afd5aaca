"""A conversion stage (converters.memory.stage): its collection looks only at the objects the stage made, frees
the reference cycles it left, and leaves the process's garbage collector as it found it."""
import gc
import weakref

import pytest

from tftrt_py.converters import memory


@pytest.fixture
def no_automatic_collection():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the garbage collector frees it


def test_a_stage_frees_the_cycles_it_made_and_leaves_older_garbage_to_later_collections(no_automatic_collection):
    older = Node()
    older_ref = weakref.ref(older)
    del older
    with memory.stage():
        assert gc.get_freeze_count() > 0  # what existed before the stage is set aside meanwhile
        made = Node()
        made_ref = weakref.ref(made)
        del made
    assert made_ref() is None
    assert older_ref() is not None and gc.get_freeze_count() == 0
    gc.collect()
    assert older_ref() is None


def test_objects_the_process_froze_itself_stay_frozen():
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with memory.stage():
            made_ref = weakref.ref(Node())
        assert made_ref() is None and gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_stage_that_fails_still_collects_and_unfreezes():
    try:
        with memory.stage():
            made_ref = weakref.ref(Node())
            raise ValueError("the stage failed")
    except ValueError:
        pass
    assert made_ref() is None and gc.get_freeze_count() == 0
