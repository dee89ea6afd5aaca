"""The TRTEngineOp kernel (kernel.cc) and its loader, with the dispatcher faked."""
from __future__ import annotations

import gc
import itertools
import logging
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import function_pb2, node_def_pb2

from threads import run_threads
from tftrt_py.engine_op import dispatcher, library


@pytest.fixture(scope="module")
def ops():
    return library.load()


_handles = itertools.count(101)


class FakeDispatcher:
    """Records create/run/release calls; run's answer comes from `self.respond`.

    Handles are unique across tests: kernels of earlier tests may be released later.
    """

    def __init__(self):
        self.created, self.handles, self.runs, self.released = [], [], [], []
        self.respond = lambda handle, inputs, assets: None
        self.respond_replay = lambda handle, inputs: False  # no native replays (see test_native_replay.py)
        self.lock = threading.Lock()

    def create(self, node_def, function_def, callees):
        with self.lock:
            self.created.append((node_def, function_def))
            self.handles.append(next(_handles))
            return self.handles[-1]

    def run(self, handle, inputs, assets, allocate):
        with self.lock:
            self.runs.append((handle, inputs, assets))
            self.allocate = allocate  # the latest call's
        return self.respond(handle, inputs, assets)

    def replay(self, handle, inputs):
        return self.respond_replay(handle, inputs)

    def release(self, handle):
        self.released.append(handle)


@pytest.fixture
def fake(monkeypatch):
    f = FakeDispatcher()
    for name in ("create", "run", "replay", "release"):
        monkeypatch.setattr(dispatcher, name, getattr(f, name), raising=False)
    return f


def as_array(item):
    """An input tuple from the kernel as an ndarray (a view on the tensor's buffer)."""
    dtype, shape, view = item
    return np.frombuffer(view, dtype=dtype).reshape(shape)


def segment(fn, *specs):
    """A concrete function usable as segment_func."""
    return tf.function(fn, autograph=False).get_concrete_function(*specs)


def test_outputs_come_from_run(ops, fake):
    outs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7, -8, 9], np.int32),
            np.float32(3.5)]
    fake.respond = lambda h, inputs, assets: outs

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([4], tf.int32)])
    def f(x, n):
        return ops.trt_engine_op([x, n], [], OutT=[tf.float32, tf.int32, tf.float32],
                                 output_shapes=[[2, 3], [None], []])

    static = f.get_concrete_function().structured_outputs
    assert [t.shape.as_list() for t in static] == [[2, 3], [None], []]
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    n = np.array([1, 2, 3, 4], np.int32)
    got = f(x, n)
    for g, want in zip(got, outs):
        assert g.dtype.as_numpy_dtype == want.dtype
        np.testing.assert_array_equal(g.numpy(), want)

    (handle, inputs, assets), = fake.runs
    assert handle == fake.handles[0] and assets == []
    assert [(d, s) for d, s, _ in inputs] == [("float32", (2, 3)), ("int32", (4,))]
    assert all(isinstance(v, memoryview) and v.readonly for _, _, v in inputs)
    np.testing.assert_array_equal(as_array(inputs[0]), x)
    np.testing.assert_array_equal(as_array(inputs[1]), n)


def test_outputs_written_through_allocate_are_tensorflows_own(ops, fake):
    """allocate(index, shape) gives a writable view of TF's output tensor: what run() writes there is the
    op's output, with no copy back; outputs it did not allocate are still copied from what run() returns."""
    def respond(h, inputs, assets):
        x = as_array(inputs[0])
        first = np.frombuffer(fake.allocate(0, x.shape), np.float32).reshape(x.shape)
        np.multiply(x, 3, out=first)
        return [first, np.array([5, 6], np.int32)]
    fake.respond = respond

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32, tf.int32])

    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    first, second = f(x)
    np.testing.assert_array_equal(first.numpy(), x * 3)
    np.testing.assert_array_equal(second.numpy(), [5, 6])


def test_allocate_refuses_bad_requests_and_use_after_the_call(ops, fake):
    errors = []

    def respond(h, inputs, assets):
        for args in [(1, (2,)), (-1, (2,)), (0, (-5,)), (0, "ab"), (0, (2**62, 2**62))]:
            try:
                fake.allocate(*args)
            except (IndexError, ValueError, TypeError, RuntimeError) as exc:
                errors.append(type(exc).__name__)
        return [as_array(inputs[0])]
    fake.respond = respond

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32])

    x = np.ones(2, np.float32)
    np.testing.assert_array_equal(f(x)[0].numpy(), x)
    assert errors == ["IndexError", "IndexError", "ValueError", "TypeError", "ValueError"]
    with pytest.raises(RuntimeError, match="only while the kernel's run"):
        fake.allocate(0, (2,))


def test_inputs_outlive_the_call_and_assets_are_bytes(ops, fake):
    """Memoryviews kept by Python stay valid after run() returns (they own the tensor buffer)."""
    fake.respond = lambda h, inputs, assets: [as_array(inputs[0]) + 1]
    dtypes = [tf.float16, tf.int8, tf.bool]

    @tf.function
    def f(x, a, b, c):
        return ops.trt_engine_op([x, a, b], [c, tf.constant([b"p2", b"p3"])], OutT=[tf.float16])

    x = np.linspace(0, 1, 12, dtype=np.float16).reshape(3, 4)
    a, b = np.array([-3, 4], np.int8), np.array([[True, False]])
    out, = f(x, a, b, tf.constant(b"p1"))
    np.testing.assert_array_equal(out.numpy(), x + 1)
    del out
    _, inputs, assets = fake.runs[0]
    assert [d for d, _, _ in inputs] == [t.name for t in dtypes]
    assert assets == [b"p1", b"p2", b"p3"]
    for item, want in zip(inputs, [x, a, b]):
        np.testing.assert_array_equal(as_array(item), want)
    with pytest.raises(ValueError, match="read-only"):
        as_array(inputs[0])[0, 0] = 1  # read-only


def test_none_runs_the_native_segment(ops, fake):
    seg = segment(lambda x, n: (x * 2 + 1, n * 3),
                  tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32)])
    def f(x, n):
        return ops.trt_engine_op([x, n], [tf.constant(b"engine.plan")], OutT=[tf.float32, tf.int32],
                                 segment_func=seg)

    for size in (3, 5):  # the instantiated function handle is reused
        x = np.arange(size, dtype=np.float32)
        y, m = f(x, np.arange(size, dtype=np.int32))
        np.testing.assert_array_equal(y.numpy(), x * 2 + 1)
        np.testing.assert_array_equal(m.numpy(), np.arange(size) * 3)
    assert len(fake.runs) == 2 and fake.runs[0][2] == [b"engine.plan"]


@pytest.mark.parametrize("body, outs, error, message", [
    (lambda x: tf.debugging.check_numerics(tf.math.log(x), "needs positive"), [tf.float32],
     tf.errors.InvalidArgumentError, "TRTEngineOp seg7: native segment .*needs positive"),
    (lambda x: x, [tf.int32], tf.errors.InternalError, "native segment output 0 is float; expected int32"),
    (lambda x: x, [tf.float32, tf.float32], tf.errors.InternalError, "returned 1 outputs; expected 2"),
])
def test_native_segment_failures(ops, fake, body, outs, error, message):
    seg = segment(body, tf.TensorSpec([None], tf.float32))

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=outs, segment_func=seg, name="seg7")

    with pytest.raises(error, match=message):
        f(-tf.ones([2]))


def test_none_without_segment_func_fails(ops, fake):
    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], name="lonely")

    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="TRTEngineOp lonely: no engine can serve this input and the native "
                             "segment is unavailable"):
        f(tf.ones([2]))


@pytest.mark.parametrize("exc, error", [(ValueError, tf.errors.InvalidArgumentError),
                                        (RuntimeError, tf.errors.InternalError)])
def test_run_raising_fails_with_its_message(ops, fake, exc, error):
    def boom(h, inputs, assets):
        raise exc("engine exploded")
    fake.respond = boom

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], name="engine7")

    with pytest.raises(error, match=f"TRTEngineOp engine7: {exc.__name__}: engine exploded"):
        f(tf.ones([2]))


@pytest.mark.parametrize("result, message", [
    ([np.zeros(2, np.float32)], "returned 1 outputs; expected 2"),
    ([np.zeros(2, np.float64), np.zeros(2, np.int32)], "output 0 of dispatcher.run has dtype float64; "
                                                        "expected float32"),
    ([np.zeros(2, np.float32), np.zeros(2, np.int64)], "output 1 of dispatcher.run has dtype int64; "
                                                        "expected int32"),
    ([np.zeros(2, np.float32), np.zeros(2, np.uint32)], "output 1 .* has dtype uint32; expected int32"),
    ([np.zeros((4, 4), np.float32)[:, ::2], np.zeros(2, np.int32)], "output 0 .* not a C-contiguous float32"),
    ([b"ab", np.zeros(2, np.int32)], "output 0 .* has dtype uint8; expected float32"),
    ([object(), np.zeros(2, np.int32)], "output 0 .*object.* is not a C-contiguous float32"),
    (3, "must return a list of arrays or None, got int"),
])
def test_wrong_results_give_clear_errors(ops, fake, result, message):
    fake.respond = lambda h, inputs, assets: result

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32, tf.int32], output_shapes=[[2], [None]])

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        f(tf.ones([2]))


def test_outputs_outside_output_shapes_pass_as_in_tf_trt(ops, fake):
    """An input outside the signature's static dims gives outputs outside output_shapes: TF-TRT runs it."""
    fake.respond = lambda h, inputs, assets: [as_array(inputs[0]) * 2]

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], output_shapes=[[None, 1, 1]])

    x = np.arange(8, dtype=np.float32).reshape(4, 2, 1)
    np.testing.assert_array_equal(f(x)[0].numpy(), x * 2)


@pytest.mark.parametrize("code, error", [(10, tf.errors.AbortedError), (5, tf.errors.NotFoundError),
                                         (99, tf.errors.InternalError), ("10", tf.errors.InternalError)])
def test_an_exception_declaring_error_code_gives_that_status(ops, fake, code, error):
    class Declared(RuntimeError):
        error_code = code

    def refuse(h, inputs, assets):
        raise Declared("no way")
    fake.respond = refuse

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], name="engine9")

    with pytest.raises(error, match="TRTEngineOp engine9: .*Declared: no way"):
        f(tf.ones([2]))


def test_tf_trt_attrs_are_registered_with_its_defaults(ops):
    from tensorflow.python.framework import op_def_registry

    attrs = {a.name: a for a in op_def_registry.get("TRTEngineOp").attr}
    assert attrs["profile_strategy"].default_value.s == b""
    assert attrs["segment_funcdef_name"].default_value.s == b""
    assert list(attrs["cached_engine_batches"].default_value.list.i) == []
    assert attrs["cached_engine_batches"].has_minimum and attrs["cached_engine_batches"].minimum == 0
    assert attrs["fixed_input_size"].default_value.b is True
    assert attrs["static_engine"].default_value.b is True
    assert attrs["use_explicit_precision"].default_value.b is False
    assert "_allow_build_at_runtime" not in attrs  # TF-TRT's internal attr: set on nodes, never registered


def test_a_node_with_tf_trt_attrs_runs(ops, fake):
    fake.respond = lambda h, inputs, assets: [as_array(inputs[0]) + 1]

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], segment_funcdef_name="old", cached_engine_batches=[1, 8],
                                 fixed_input_size=False, static_engine=False, use_explicit_precision=True,
                                 profile_strategy="Range")

    np.testing.assert_array_equal(f(tf.ones([2]))[0].numpy(), [2, 2])
    node = next(n for n in f.get_concrete_function(tf.TensorSpec([2])).graph.as_graph_def().node
                if n.op == "TRTEngineOp")
    assert node.attr["profile_strategy"].s == b"Range" and list(node.attr["cached_engine_batches"].list.i) == [1, 8]


def test_create_gets_node_and_function_defs(ops, fake):
    seg = segment(lambda x: x * 2 + 1, tf.TensorSpec([None], tf.float32))

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], segment_func=seg, precision_mode="FP16",
                                 input_shapes=[[None]], serialized_segment=b"\x00seg", name="TRTEngineOp_000")

    np.testing.assert_array_equal(f(tf.ones([3]))[0].numpy(), [3, 3, 3])
    (node_bytes, function_bytes), = fake.created  # one kernel, built once
    node = node_def_pb2.NodeDef.FromString(node_bytes)
    assert node.op == "TRTEngineOp" and node.name == "TRTEngineOp_000"
    assert node.attr["precision_mode"].s == b"FP16"
    assert node.attr["serialized_segment"].s == b"\x00seg"
    assert node.attr["segment_func"].func.name == seg.name.decode()
    assert node.attr["input_shapes"].list.shape[0].dim[0].size == -1
    function = function_pb2.FunctionDef.FromString(function_bytes)
    assert function.signature.name == seg.name.decode()
    assert {h for h, _, _ in fake.runs} == set(fake.handles)


def test_create_without_segment_func_gets_empty_bytes(ops, fake):
    fake.respond = lambda h, inputs, assets: [np.float32(1)]

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32])

    f(tf.ones([1]))
    assert fake.created[0][1] == b""


def test_create_raising_fails_the_call(ops, fake, monkeypatch):
    def create(node_def, function_def, callees):
        raise KeyError("no such engine")
    monkeypatch.setattr(dispatcher, "create", create)

    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32])

    with pytest.raises(tf.errors.InternalError, match="dispatcher.create failed: KeyError: 'no such engine'"):
        f(tf.ones([1]))


def test_release_when_the_function_goes(ops, fake):
    @tf.function
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32])

    fake.respond = lambda h, inputs, assets: [np.zeros(1, np.float32)]
    f(tf.ones([1]))
    del f
    gc.collect()
    assert len(fake.handles) == 1 and fake.handles[0] in fake.released


@pytest.mark.parametrize("native", [False, True])
def test_concurrent_calls(ops, fake, native):
    def respond(h, inputs, assets):
        time.sleep(0.005)  # let the threads overlap
        return None if native else [as_array(inputs[0]) * 2 + 1]
    fake.respond = respond
    seg = segment(lambda x: x * 2 + 1, tf.TensorSpec([None], tf.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], segment_func=seg)

    def worker(k):
        for i in range(20):
            x = np.full(k + i + 1, float(k * 100 + i), np.float32)
            np.testing.assert_array_equal(f(x)[0].numpy(), x * 2 + 1)
    run_threads(worker, range(4))
    assert len(fake.runs) == 80


def test_saved_model_round_trip(ops, fake, tmp_path):
    seg = segment(lambda x: x * 2 + 1, tf.TensorSpec([None], tf.float32))
    module = tf.Module()
    module.f = tf.function(lambda x: ops.trt_engine_op([x], [], OutT=[tf.float32], segment_func=seg,
                                                       output_shapes=[[None]]),
                           input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    out = loaded.f(tf.constant([1.0, 2.0]))
    np.testing.assert_array_equal(out[0].numpy(), [3.0, 5.0])
    assert fake.created and fake.created[-1][1]  # the segment FunctionDef came along


# --- the loader ---------------------------------------------------------------------------------

@pytest.fixture
def compiles(monkeypatch):
    """Counts real compiles."""
    calls = []
    real = library._compile

    def spy(path):
        calls.append(path)
        real(path)
    monkeypatch.setattr(library, "_compile", spy)
    return calls


def test_build_is_cached_per_cache_dir(monkeypatch, tmp_path, compiles):
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "a"))
    path = library.build()
    assert path.is_file() and path.is_relative_to(tmp_path / "a")
    assert path.parent.name.startswith(tf.__version__ + "-")
    assert library.build() == path and len(compiles) == 1  # cached
    assert sorted(p.name for p in path.parent.iterdir()) == [  # its digest and lock, no temp files
        library.LIBRARY_NAME, library.LIBRARY_NAME + ".lock", library.LIBRARY_NAME + ".sha256"]
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "b"))
    monkeypatch.setattr(library, "_compile", lambda p: compiles.append(p))  # a fake compile this time
    library.build()
    assert len(compiles) == 2 and compiles[1].is_relative_to(tmp_path / "b")


def test_load_is_memoized(ops, compiles):
    assert library.load() is ops and library.trt_engine_op.__doc__
    assert compiles == []


def test_missing_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(library.OpLibraryError, match=r"\$CXX .*no-such-g\+\+.* not found.*(g\+\+|CXX).*"
                                                     r"TFTRT_PY_OP_LIBRARY.*--build --out"):
        library.build()


def test_a_compile_says_so_at_warning(monkeypatch, tmp_path, caplog):
    cxx = tmp_path / "fake-cxx"  # "compiles" by writing the file named after -o
    cxx.write_text('#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\necho lib > "$2"\n')
    cxx.chmod(0o755)
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    with caplog.at_level(logging.WARNING, logger=library.__name__):
        path = library.build()
    assert path.read_text() == "lib\n"
    [record] = [r for r in caplog.records if r.name == library.__name__]
    assert record.levelno == logging.WARNING and "Compiling the TRTEngineOp op library" in record.getMessage()
    assert "15-30 s" in record.getMessage() and str(path) in record.getMessage()


def test_compile_failure_shows_the_compiler_output(monkeypatch, tmp_path):
    cxx = tmp_path / "bad-cxx"
    cxx.write_text("#!/bin/sh\necho 'kernel.cc:1: error: something broke' >&2\nexit 1\n")
    cxx.chmod(0o755)
    monkeypatch.setenv(library.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(cxx))
    with pytest.raises(library.OpLibraryError, match="(?s)failed.*error: something broke"):
        library.build()
    assert [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()] == [  # temp file removed
        library.LIBRARY_NAME + ".lock"]
