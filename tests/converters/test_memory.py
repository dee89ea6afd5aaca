"""A conversion stage frees what it made and dropped when it ends, examining only its own objects (the older ones
set aside meanwhile and put back after), and leaves a user's frozen objects frozen."""
import gc
import weakref

import pytest

from tftrt_py.converters.memory import MemoryReturn, frees_its_memory


class Cycle:
    """An object that refers to itself: only a garbage collection frees it."""

    def __init__(self):
        self.me = self


def test_what_a_stage_drops_in_reference_cycles_is_collected_when_it_returns():
    made = []

    @frees_its_memory
    def stage():
        cycle = Cycle()
        made.append(weakref.ref(cycle))

    gc.disable()  # no automatic collection in between: the stage's own does it
    try:
        stage()
        assert made[0]() is None
    finally:
        gc.enable()


def test_the_objects_older_than_a_stage_are_put_back_when_it_returns_or_raises():
    seen = []

    @frees_its_memory
    def stage(fail):
        seen.append(gc.get_freeze_count())
        if fail:
            raise ValueError("the stage failed")

    stage(False)
    with pytest.raises(ValueError, match="the stage failed"):
        stage(True)
    assert min(seen) > 0  # set aside while it ran
    assert gc.get_freeze_count() == 0


def test_objects_older_than_a_stage_that_it_drops_are_collected_by_the_collections_after_it():
    older = Cycle()
    gone = weakref.ref(older)

    @frees_its_memory
    def stage():
        nonlocal older
        older = None

    stage()
    gc.collect()
    assert gone() is None


def test_a_users_frozen_objects_stay_frozen_through_a_stage():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()

        @frees_its_memory
        def stage():
            return Cycle()

        assert isinstance(stage(), Cycle)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_stage_after_a_converter_went_collects_what_that_converter_left_in_cycles():
    class Converter:
        def __init__(self):
            self.graph = Cycle()
            self._memory = MemoryReturn()  # (as TrtGraphConverterV2: the last attribute)

    converter = Converter()
    left = weakref.ref(converter.graph)

    @frees_its_memory
    def stage():
        pass

    gc.disable()
    try:
        converter = None  # freed by its count; its graph is a cycle only a collection frees
        assert left() is not None
        stage()
        assert left() is None
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_objects_frozen_before_the_module_was_imported_do_not_keep_a_stage_from_setting_older_ones_aside(
        monkeypatch):
    from tftrt_py.converters import memory

    gc.freeze()  # as CPython 3.12 starts, with objects of its own frozen
    try:
        monkeypatch.setattr(memory, "_FROZEN_AT_IMPORT", gc.get_freeze_count())
        seen = []

        @frees_its_memory
        def stage():
            Cycle()
            seen.append(gc.get_freeze_count())

        stage()
        assert seen[0] > memory._FROZEN_AT_IMPORT  # the stage set its older objects aside
        assert gc.get_freeze_count() == 0  # and put every frozen object back
    finally:
        gc.unfreeze()
