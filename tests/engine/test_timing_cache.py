"""The timing cache (engine/timing_cache.py) and the cupy tuner's use of it, without a GPU: entries round-trip
through bytes and files; a corrupt, huge, foreign or malicious file is ignored with one warning and never
overwritten; other GPUs' entries are kept but not used; saves of two writers merge; the setting moves or disables
the default cache; a tuner with a warm cache rebuilds the recorded tactic without timing (fake ops and timings)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from networks import conv_relu_pool_net
from tftrt_py.engine import Builder, BuilderConfig, BuildError, Runtime
from tftrt_py.engine import backends, timing_cache
from tftrt_py.engine.backends.cupy import backend as cupy_backend
from tftrt_py.engine.backends.cupy import cublaslt, cudnn_warmup, tactics, triton
from tftrt_py.engine.backends.cupy.ops.base import BuildOptions, Spec
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.timing_cache import TimingCache, TimingCacheError, TimingKey

H100 = {"gpu": "NVIDIA H100 80GB HBM3 (sm_90)", "cupy": "14.0.0", "cudnn": 91400}
H200 = dict(H100, gpu="NVIDIA H200 (sm_90)")
OPTIONS = {"allow_tf32": False, "max_workspace": 1 << 30}


def key(layer="conv", device=H100, options=OPTIONS) -> TimingKey:
    return TimingKey.of(layer, options, device)


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == timing_cache.__name__ and r.levelno >= logging.WARNING]


# -- the cache ---------------------------------------------------------------------------------------------------
def test_entries_round_trip_through_bytes_and_files(tmp_path):
    cache = TimingCache()
    cache.record(key("a"), {"op": "cudnn_conv", "plan": 3, "tile": (64, 32), "ms": 0.0123, "candidates": 4})
    cache.record(key("b"), {"op": "gemm_conv", "im2col": True, "workspace": 0, "notes": None})
    assert len(cache) == 2
    assert cache.lookup(key("a")) == {"op": "cudnn_conv", "plan": 3, "tile": [64, 32], "ms": 0.0123, "candidates": 4}
    assert cache.lookup(key("c")) is None

    again = TimingCache.deserialize(cache.serialize())
    assert len(again) == 2 and again.lookup(key("b")) == cache.lookup(key("b"))

    path = tmp_path / "sub" / "cache.json"
    assert cache.save(str(path)) and json.loads(path.read_text())["version"] == timing_cache.VERSION
    loaded = TimingCache.load(str(path))
    assert loaded.path == str(path) and loaded.serialize() == cache.serialize() and not loaded.unsaved
    assert [p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")] == ["cache.json"]  # no temp files


def test_lookup_returns_a_copy_and_a_tactic_must_be_json_data():
    cache = TimingCache()
    cache.record(key(), {"op": "x", "epilogues": ["BIAS"]})
    cache.lookup(key())["epilogues"].append("GELU")
    assert cache.lookup(key()) == {"op": "x", "epilogues": ["BIAS"]}
    for bad in ({"op": object()}, {"ms": float("nan")}, {"op": "x" * (timing_cache.MAX_TEXT + 1)}):
        with pytest.raises(TimingCacheError):
            cache.record(key(), bad)
    with pytest.raises(TimingCacheError):
        TimingKey.of("conv", {"nested": {"no": 1}}, H100)
    assert cache.lookup(key()) == {"op": "x", "epilogues": ["BIAS"]}


def _valid_entry():
    return {"layer": "conv", "options": OPTIONS, "device": H100, "tactic": {"op": "x"}}


def _doc(**changes):
    doc = {"format": timing_cache.FORMAT, "version": timing_cache.VERSION, "entries": [_valid_entry()]}
    doc.update(changes)
    return json.dumps(doc).encode()


BAD_FILES = {
    "not JSON": b"{\"format\": \"tftrt_py timing cache\", \"version\": 1, \"entr",
    "not UTF-8": b"\xff\xfe\x00garbage",
    "foreign JSON": json.dumps({"name": "someone else's file", "values": [1, 2, 3]}).encode(),
    "a JSON list": b"[1, 2, 3]",
    "a newer version": _doc(version=timing_cache.VERSION + 1),
    "a bool for the version": _doc(version=True),
    "an extra field": _doc(extra=1),
    "entries not a list": _doc(entries={"conv": {"op": "x"}}),
    "an entry missing its tactic": _doc(entries=[{"layer": "conv", "options": {}, "device": H100}]),
    "a tactic that is a list": _doc(entries=[dict(_valid_entry(), tactic=["op", "x"])]),
    "a layer that is a number": _doc(entries=[dict(_valid_entry(), layer=7)]),
    "a nested device": _doc(entries=[dict(_valid_entry(), device={"gpu": ["a"]})]),
    "a tactic nested too deep": _doc(entries=[dict(_valid_entry(), tactic=json.loads("{\"a\":" * 12 + "1" +
                                                                                      "}" * 12))]),
    "a tactic with too many items": _doc(entries=[dict(_valid_entry(),
                                                       tactic={"op": list(range(timing_cache.MAX_ITEMS + 1))})]),
    "NaN": _doc().replace(b"\"op\": \"x\"", b"\"op\": NaN"),
    "an infinite number": _doc().replace(b"\"op\": \"x\"", b"\"op\": 1e999"),
    "a huge integer": _doc().replace(b"\"op\": \"x\"", b"\"op\": " + b"9" * 5000),
    "JSON nested a million deep": b"[" * 1_000_000 + b"]" * 1_000_000,
}


@pytest.mark.parametrize("what", sorted(BAD_FILES))
def test_a_bad_file_is_ignored_with_one_warning_and_left_alone(what, tmp_path, caplog):
    path = tmp_path / "cache.json"
    path.write_bytes(BAD_FILES[what])
    with pytest.raises(TimingCacheError):
        TimingCache.deserialize(BAD_FILES[what])
    with caplog.at_level(logging.WARNING, logger=timing_cache.__name__):
        cache = TimingCache.load(str(path))
        assert len(cache) == 0
        cache.record(key(), {"op": "y"})
        assert cache.save() is False  # never overwrites what is not a timing cache
    assert len(warnings_of(caplog)) == 1 and "is not usable" in caplog.text
    assert path.read_bytes() == BAD_FILES[what]


def test_a_file_over_the_size_bound_is_not_read(tmp_path, caplog, monkeypatch):
    path = tmp_path / "cache.json"
    cache = TimingCache()
    cache.record(key(), {"op": "x", "pad": "p" * 1000})
    cache.save(str(path))
    monkeypatch.setattr(timing_cache, "MAX_BYTES", 512)
    with caplog.at_level(logging.WARNING, logger=timing_cache.__name__):
        assert len(TimingCache.load(str(path))) == 0
    assert "more than the 512" in caplog.text


def test_a_path_that_is_not_a_regular_file_is_not_opened(tmp_path, caplog):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it would block
    (tmp_path / "dir.json").mkdir()
    with caplog.at_level(logging.WARNING, logger=timing_cache.__name__):
        assert len(TimingCache.load(str(fifo))) == 0
        assert len(TimingCache.load(str(tmp_path / "dir.json"))) == 0
    assert len(warnings_of(caplog)) == 2 and "not a regular file" in caplog.text


def test_entries_of_other_gpus_and_versions_are_kept_but_not_used(tmp_path):
    path = str(tmp_path / "cache.json")
    on_h200 = TimingCache.load(path)
    on_h200.record(key(device=H200), {"op": "h200_winner"})
    on_h200.record(key(device=dict(H100, cudnn=90100)), {"op": "old_cudnn_winner"})
    on_h200.save()

    on_h100 = TimingCache.load(path)
    assert on_h100.lookup(key(device=H100)) is None
    on_h100.record(key(device=H100), {"op": "h100_winner"})
    on_h100.save()
    both = TimingCache.load(path)
    assert len(both) == 3
    assert both.lookup(key(device=H200)) == {"op": "h200_winner"}
    assert both.lookup(key(device=H100)) == {"op": "h100_winner"}
    assert both.devices() == sorted([H100, H200, dict(H100, cudnn=90100)], key=json.dumps)


@pytest.mark.parametrize("timed_on, stands_by", [(None, True), (H200, True), (H100, False)])
def test_a_calibrating_conversion_starts_the_compile_processes_unless_its_cache_knows_this_gpu(monkeypatch, timed_on,
                                                                                           stands_by):
    """A warm cache leaves them little to compile (engine/backends/cupy/helper_processes.py); no cache, or one of
    other GPUs only, leaves them everything."""
    started = []
    monkeypatch.setattr(cupy_backend._device, "device_name", lambda: H100["gpu"])
    monkeypatch.setattr(cupy_backend._device, "cudnn_module", lambda: None)
    monkeypatch.setattr(cublaslt, "available", lambda: False)
    monkeypatch.setattr(cudnn_warmup, "stand_by", lambda: started.append("cudnn"))
    monkeypatch.setattr(triton, "stand_by", lambda: started.append("triton"))
    cache = TimingCache()
    if timed_on is not None:
        cache.record(key(device=timed_on), {"op": "winner"})
    backend = object.__new__(cupy_backend.CupyBackend)  # (no GPU here)
    backend.warm_up(calibrating=False, timing_cache=None)
    assert started == []
    backend.warm_up(calibrating=True, timing_cache=cache if timed_on else None)
    assert started == (["cudnn", "triton"] if stands_by else [])


def test_two_writers_merge_and_each_keeps_its_own_record(tmp_path):
    path = str(tmp_path / "cache.json")
    first, second = TimingCache.load(path), TimingCache.load(path)
    first.record(key("a"), {"op": "first"})
    first.record(key("same"), {"op": "first"})
    second.record(key("b"), {"op": "second"})
    second.record(key("same"), {"op": "second"})
    assert first.save() and second.save()
    on_disk = TimingCache.load(path)
    assert {k.layer: v["op"] for k, v in ((k, on_disk.lookup(k)) for k in map(key, "ab"))} == {"a": "first",
                                                                                             "b": "second"}
    assert on_disk.lookup(key("same")) == {"op": "second"}  # the last save's own record
    assert second.lookup(key("a")) == {"op": "first"}  # a save takes in what others saved
    assert not first.unsaved and not second.unsaved


WRITER = """
import sys
from tftrt_py.engine.timing_cache import TimingCache, TimingKey
path, who = sys.argv[1], sys.argv[2]
for round_ in range(5):
    cache = TimingCache.load(path)
    for i in range(10):
        cache.record(TimingKey.of(f"{who}-{round_}-{i}", {}, {"gpu": "g"}), {"op": who})
    assert cache.save()
"""


def test_concurrent_processes_lose_no_entries(tmp_path):
    path = str(tmp_path / "cache.json")
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, f"p{n}"], cwd=repo) for n in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert len(TimingCache.load(path)) == 4 * 5 * 10


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    cache = TimingCache()
    cache.record(key("a"), {"op": "x"})
    cache.save(str(path))
    before = path.read_bytes()
    cache.record(key("b"), {"op": "y"})

    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        cache.save(str(path))
    assert path.read_bytes() == before and cache.unsaved
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json", "cache.json.lock"]


def test_saving_a_cache_without_a_file_needs_a_path():
    with pytest.raises(ValueError, match="no file"):
        TimingCache().save()


# -- configuration -------------------------------------------------------------------------------------------------
def test_the_setting_moves_or_disables_the_default_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(timing_cache, "_defaults", {})
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TFTRT_PY_TIMING_CACHE", raising=False)
    assert timing_cache.default_path() == str(tmp_path / "home" / ".cache" / "tftrt_py" / "timing_cache.json")
    monkeypatch.setenv("TFTRT_PY_TIMING_CACHE", " ")
    assert timing_cache.default_path() == str(tmp_path / "home" / ".cache" / "tftrt_py" / "timing_cache.json")
    for off in ("0", "off", "OFF", "false"):
        monkeypatch.setenv("TFTRT_PY_TIMING_CACHE", off)
        assert timing_cache.default_timing_cache() is None and timing_cache.for_build() is None
    monkeypatch.setenv("TFTRT_PY_TIMING_CACHE", str(tmp_path / "mine.json"))
    cache = timing_cache.default_timing_cache()
    assert cache.path == str(tmp_path / "mine.json") and timing_cache.default_timing_cache() is cache
    assert timing_cache.for_build() is cache


def test_a_build_uses_the_cache_its_config_names_and_plans_do_not_record_it(monkeypatch, tmp_path):
    monkeypatch.setattr(timing_cache, "_defaults", {})
    monkeypatch.setenv("TFTRT_PY_TIMING_CACHE", str(tmp_path / "default.json"))
    seen = []

    class Spy(NumpyBackend):
        def prepare_engine(self, engine):
            seen.append(timing_cache.for_build())
            super().prepare_engine(engine)

    monkeypatch.setitem(backends._FACTORIES, "spy", Spy)
    monkeypatch.setitem(backends._INSTANCES, "spy", Spy())
    mine = TimingCache()
    for choice in (mine, False, None):
        engine = Builder(BuilderConfig(backend="spy", timing_cache=choice)).build_engine(conv_relu_pool_net())
        assert "timing_cache" not in engine.build_config
        Runtime("numpy").deserialize_cuda_engine(engine.serialize())
    assert seen[0] is mine and seen[1] is None and seen[2] is timing_cache.default_timing_cache()
    assert timing_cache.for_build() is timing_cache.default_timing_cache()  # only during the build
    with pytest.raises(BuildError, match="timing_cache"):
        BuilderConfig(timing_cache="~/cache.json")


def test_the_backend_saves_what_a_build_recorded_and_a_failed_save_is_said_once(tmp_path, caplog):
    path = tmp_path / "cache.json"
    cache = TimingCache.load(str(path))
    cupy_backend._save(cache)
    assert not path.exists()  # nothing recorded
    cache.record(key(), {"op": "x"})
    cupy_backend._save(cache)
    assert TimingCache.load(str(path)).lookup(key()) == {"op": "x"}

    (tmp_path / "file").write_text("")
    blocked = TimingCache.load(str(tmp_path / "file" / "cache.json"))  # its folder is a file
    blocked.record(key(), {"op": "x"})
    with caplog.at_level(logging.WARNING):
        cupy_backend._save(blocked)
        cupy_backend._save(blocked)
    assert caplog.text.count("could not save the timing cache") == 1


# -- the tuner -----------------------------------------------------------------------------------------------------
class FakeOp:
    workspace = 0

    def __init__(self, tactic):
        self.tactic = dict(tactic)


class FakeGpu:
    """Candidates of one layer (their tactics and times); counts factory calls and timed candidates."""

    def __init__(self, times):
        self.times, self.timed, self.built, self.broken = dict(times), [], 0, False

    def factory(self, spec):
        self.built += 1
        if self.broken and spec.prefer is not None:
            raise RuntimeError("this plan no longer compiles")
        return [FakeOp({"op": name, "tile": [8, 8]}) for name in self.times]

    def time_all(self, tuner, spec, cands):
        self.timed.append([c.tactic["op"] for c in cands])
        for c in cands:
            c.ms = self.times[c.tactic["op"]]
        return sorted(cands, key=lambda c: c.ms)

    def time_one(self, tuner, op, ins, outs):
        self.timed.append([type(op).__name__])
        return 0.25


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeGpu({"slow": 3.0, "fast": 1.0, "middle": 2.0})
    monkeypatch.setattr(tactics, "device_versions", lambda: dict(H100))
    monkeypatch.setattr(tactics.Tuner, "_time_all", lambda self, spec, cands: fake.time_all(self, spec, cands))
    monkeypatch.setattr(tactics.Tuner, "_time", lambda self, op, ins, outs: fake.time_one(self, op, ins, outs))
    monkeypatch.setattr(tactics.Tuner, "_io", lambda self, *shapes: ([], []))
    return fake


def spec_of(options, name="conv", prefer=None, width=4):
    layer = SimpleNamespace(name=name, kind="Convolution", params={"groups": 1}, weights={})
    return Spec(layer, [(1, width)], ["float32"], [(1, width)], ["float32"], "float32", options, prefer=prefer)


def test_a_warm_cache_rebuilds_the_recorded_tactic_without_timing(gpu, tmp_path):
    cache = TimingCache.load(str(tmp_path / "cache.json"))
    options = BuildOptions(timing_cache=cache)
    op, record = tactics.Tuner(None, options).choose(spec_of(options), gpu.factory)
    assert gpu.timed == [["slow", "fast", "middle"]] and op.tactic["op"] == "fast"
    assert record == {"op": "fast", "tile": [8, 8], "ms": 1.0, "candidates": 3} and len(cache) == 1
    cache.save()

    gpu.timed.clear()
    warm = TimingCache.load(str(tmp_path / "cache.json"))  # as a new process would
    options = BuildOptions(timing_cache=warm)
    tuner = tactics.Tuner(None, options)
    op2, record2 = tuner.choose(spec_of(options), gpu.factory)
    assert gpu.timed == [] and op2.tactic["op"] == "fast" and record2 == record
    assert not warm.unsaved  # nothing new to write
    assert tuner.choose(spec_of(options, name="conv_2"), gpu.factory)[1] == record  # same signature, this build
    assert gpu.timed == []


def test_a_recorded_tactic_that_no_longer_builds_is_timed_again(gpu):
    cache = TimingCache()
    options = BuildOptions(timing_cache=cache)
    tactics.Tuner(None, options).choose(spec_of(options), gpu.factory)
    gpu.timed.clear()

    del gpu.times["fast"]  # a library update dropped that kernel
    op, record = tactics.Tuner(None, options).choose(spec_of(options), gpu.factory)
    assert gpu.timed == [["slow", "middle"]] and op.tactic["op"] == "middle"
    assert cache.lookup(next(iter(cache._entries)))["op"] == "middle"

    gpu.timed.clear()
    gpu.broken = True  # building the recorded tactic raises
    op, _ = tactics.Tuner(None, options).choose(spec_of(options), gpu.factory)
    assert gpu.timed == [["slow", "middle"]] and op.tactic["op"] == "middle"


@pytest.mark.parametrize("change", ["another GPU", "TF32", "workspace", "check mode", "no cache"])
def test_entries_for_other_gpus_or_options_are_not_used(gpu, monkeypatch, change):
    cache = TimingCache()
    options = BuildOptions(timing_cache=cache)
    tactics.Tuner(None, options).choose(spec_of(options), gpu.factory)
    gpu.timed.clear()
    check = False
    if change == "another GPU":
        monkeypatch.setattr(tactics, "device_versions", lambda: dict(H200))
    elif change == "TF32":
        options.allow_tf32 = True
    elif change == "workspace":
        options.max_workspace = 1 << 20
    elif change == "check mode":
        check = True
    else:
        options.timing_cache = None
    tactics.Tuner(None, options, check=check).choose(spec_of(options), gpu.factory)
    assert gpu.timed == [["slow", "fast", "middle"]]


def test_a_plans_tactic_comes_before_the_cache(gpu):
    cache = TimingCache()
    options = BuildOptions(timing_cache=cache)
    tactics.Tuner(None, options).choose(spec_of(options), gpu.factory)
    gpu.timed.clear()
    op, record = tactics.Tuner(None, options).choose(spec_of(options, prefer={"op": "slow", "ms": 3.0}), gpu.factory)
    assert gpu.timed == [] and op.tactic["op"] == "slow" and record["ms"] == 3.0
    assert cache.lookup(next(iter(cache._entries)))["op"] == "fast"  # a plan's choice is not recorded


def test_single_candidate_times_and_op_times_are_cached_too(gpu):
    gpu.times = {"only": 0.5}
    cache = TimingCache()
    options = BuildOptions(timing_cache=cache)
    cold = tactics.Tuner(None, options)
    step = FakeOp({"op": "quantize", "scale": 0.1})
    assert cold.fastest_ms(spec_of(options), gpu.factory) == 0.5
    assert cold.op_ms(step, [(1, 4)], ["float16"], [(1, 4)], ["int8"]) == 0.25
    assert gpu.timed == [["only"], ["FakeOp"]] and len(cache) == 2

    gpu.timed.clear()
    built = gpu.built
    warm = tactics.Tuner(None, options)
    assert warm.fastest_ms(spec_of(options), gpu.factory) == 0.5
    assert gpu.built == built  # a cached time needs no tactic built (no kernel compiled)
    assert warm.op_ms(step, [(1, 4)], ["float16"], [(1, 4)], ["int8"]) == 0.25
    assert gpu.timed == []
    warm.op_ms(step, [(2, 4)], ["float16"], [(2, 4)], ["int8"])  # other shapes: timed
    assert gpu.timed == [["FakeOp"]]


def test_candidates_built_ahead_side_by_side_are_the_ones_timed_and_recorded_tactics_are_not_built_ahead(
        gpu, monkeypatch):
    runtime = SimpleNamespace(getDevice=lambda: 0, setDevice=lambda device: None)
    monkeypatch.setattr(tactics._device, "require", lambda: SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    options = BuildOptions(timing_cache=TimingCache())
    tactics.Tuner(None, options).choose(spec_of(options, width=8), gpu.factory)  # the cache holds width 8
    gpu.built, gpu.timed[:] = 0, []
    threads = []

    def factory(spec):
        threads.append(threading.current_thread().name)
        return gpu.factory(spec)

    tuner = tactics.Tuner(None, options)
    specs = [spec_of(options, name=f"conv_{width}", width=width) for width in (4, 8, 16)]
    tuner.prebuild([(spec, factory) for spec in specs])
    assert gpu.built == 2 and all(name.startswith("tftrt-prebuild") for name in threads)
    assert [tuner.choose(spec, factory)[0].tactic["op"] for spec in specs] == ["fast"] * 3
    assert gpu.built == 3  # width 8: the recorded tactic alone, built when chosen
    assert gpu.timed == [["slow", "fast", "middle"]] * 2


def test_warming_hands_the_specs_whose_tactic_is_not_known_to_the_cudnn_warmup_processes(gpu, monkeypatch):
    """A known tactic is left to choose(), which builds that one alone; the tuner keeps nothing of the warm-up."""
    options = BuildOptions(timing_cache=TimingCache())
    tactics.Tuner(None, options).choose(spec_of(options, width=8), gpu.factory)  # the cache holds width 8
    warmed = []
    monkeypatch.setattr(tactics.cudnn_warmup, "warm", lambda specs: warmed.extend(specs))
    tuner = tactics.Tuner(None, options)
    specs = [spec_of(options, name=f"conv_{width}", width=width) for width in (4, 8, 16)]
    tuner.warm(specs + specs[:1])
    assert [s.layer.name for s in warmed] == ["conv_4", "conv_16"] and not tuner._prebuilt


def test_a_layer_timed_under_one_signature_rebuilds_its_winner_under_another_of_the_same_precision(gpu):
    """A quantized layer is timed with a quantized output while precisions are chosen, then writes floats when a
    reader runs in FP16: its second spec builds the tactic that won (recorded for that signature too) and times
    nothing; a spec of another precision, or of another layer, is timed."""
    cache = TimingCache()
    options = BuildOptions(timing_cache=cache)
    tuner = tactics.Tuner(None, options)
    quant = {"format": "INT8"}
    layer = SimpleNamespace(name="conv", kind="Convolution", params={"groups": 1}, weights={})
    measured = Spec(layer, [(1, 4)], ["int8"], [(1, 4)], ["int8"], "float16", options, quant=quant)
    assert tuner.choose(measured, gpu.factory)[0].tactic["op"] == "fast" and len(gpu.timed) == 1

    gpu.times = {"slow": 3.0, "fast": 4.0, "middle": 2.0}  # timed again, "middle" would win
    writes_floats = Spec(layer, [(1, 4)], ["int8"], [(1, 4)], ["float16"], "float16", options, quant=quant)
    op, record = tuner.choose(writes_floats, gpu.factory)
    assert op.tactic["op"] == "fast" and len(gpu.timed) == 1 and "ms" not in record
    assert cache.lookup(tuner._key(writes_floats.signature()))["op"] == "fast"

    fp16 = Spec(layer, [(1, 4)], ["float16"], [(1, 4)], ["float16"], "float16", options)
    other = Spec(SimpleNamespace(**dict(vars(layer), name="conv_2")), [(1, 8)], ["int8"], [(1, 8)], ["float16"],
                 "float16", options, quant=quant)
    assert [tuner.choose(s, gpu.factory)[0].tactic["op"] for s in (fp16, other)] == ["middle", "middle"]
    assert len(gpu.timed) == 3


def test_float_candidates_are_built_ahead_before_quantized_ones_which_wait_on_the_triton_compile_process(
        gpu, monkeypatch):
    runtime = SimpleNamespace(getDevice=lambda: 0, setDevice=lambda device: None)
    monkeypatch.setattr(tactics._device, "require", lambda: SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(tactics, "PREBUILD_THREADS", 1)
    options = BuildOptions()
    started = []

    def factory(spec):
        started.append(spec.layer.name)
        return gpu.factory(spec)

    def spec(name, quantized):
        layer = SimpleNamespace(name=name, kind="Convolution", params={"groups": 1}, weights={})
        dtype, shape = "int8" if quantized else "float16", (1, 4 if name.startswith("a") else 8)
        return Spec(layer, [shape], [dtype], [shape], [dtype], "float16", options,
                    quant={"format": "INT8"} if quantized else None)

    tactics.Tuner(None, options).prebuild([(spec(name, name.endswith("q")), factory)
                                           for name in ("a_q", "a", "b_q", "b")])
    assert started == ["a", "b", "a_q", "b_q"]
