"""TrtGraphConverterV2 end to end: convert, build, save, load, serve — and its errors."""
import gc
import re
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

from support import random_array, run_json_process
from threads import run_threads
from tftrt_py import trt_convert as trt
from tftrt_py.convert.errors import AlreadyConvertedError
from tftrt_py.converters import converter_v2
from tftrt_py.converters.summary import conversion_ratio
from tftrt_py.engine.timing_cache import TimingCache
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op import op as engine_op



def engine_nodes(func):
    return [n for n in func.graph.as_graph_def().node if n.op == "TRTEngineOp"]


def engine_stats(converter):
    names = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    return {name: trt.engine_op_stats()[name] for name in names}


def only_stats(converter):
    (stats,) = engine_stats(converter).values()
    return stats


def only_engine(converter):
    (name,) = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    return name


def fresh_segment_keys(converter):
    """Engine ops are shared by segment key across loads; a fresh conversion gets fresh keys."""
    return {n.attr["segment_key"].s for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"}


def test_convert_keeps_the_signature(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    func = converter.convert()
    original = tf.saved_model.load(saved_model("mlp")).signatures["serving_default"]
    assert func.structured_input_signature == original.structured_input_signature
    assert list(func.structured_outputs) == list(original.structured_outputs)
    for key, spec in original.structured_outputs.items():
        assert func.structured_outputs[key].dtype == spec.dtype
        assert func.structured_outputs[key].shape.as_list() == spec.shape.as_list()
    [node] = engine_nodes(func)
    assert re.fullmatch(r"TRTEngineOp_\d{3}_000", node.name)
    assert node.attr["segment_func"].func.name == f"{node.name}_native_segment"
    x = random_array((3, 16))
    got, want = func(features=tf.constant(x)), original(features=tf.constant(x))
    assert list(got) == list(want) and set(got) == {"scores", "logits"}  # the model's dict, keys as TF gives them
    for key in want:
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-5)


def test_minimum_segment_size_minus_one_converts_nothing(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), minimum_segment_size=-1)
    assert engine_nodes(converter.convert()) == []


def test_errors_for_bad_saved_models(tmp_path, saved_model):
    with pytest.raises(ValueError, match="does not exist"):
        trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "missing")).convert()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a SavedModel directory"):
        trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "empty")).convert()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "saved_model.pb").write_bytes(b"this is not a protobuf")
    with pytest.raises(ValueError, match="cannot load SavedModel"):
        trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "bad")).convert()
    with pytest.raises(ValueError, match="has no signature 'nope'"):
        trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"),
                                input_saved_model_signature_key="nope").convert()


def test_convert_twice_is_an_error_saying_to_make_a_new_converter(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converted = converter.convert()
    with pytest.raises(AlreadyConvertedError, match="^convert\\(\\) was already called on this TrtGraphConverterV2; a "
                                                    "converter converts once: make a new TrtGraphConverterV2 to "
                                                    "convert again$"):
        converter.convert()
    assert converter._converted_func is converted  # the first conversion stands


def test_calibration_input_fn_rules(saved_model):
    with pytest.raises(ValueError, match="Should specify calibration_input_fn"):
        trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), precision_mode="INT8").convert()
    with pytest.raises(ValueError, match="Should not specify calibration_input_fn"):
        trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp")).convert(
            calibration_input_fn=lambda: iter([]))


def test_build_errors(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    with pytest.raises(RuntimeError, match="Need to call convert"):
        converter.build(input_fn=lambda: iter([random_array((1, 16))]))
    converter.convert()
    with pytest.raises(RuntimeError, match="input_fn is None"):
        converter.build(input_fn=None)
    converter.build(input_fn=lambda: iter([random_array((1, 16))]))
    with pytest.raises(NotImplementedError, match="more than once"):
        converter.build(input_fn=lambda: iter([random_array((1, 16))]))


@pytest.mark.parametrize("form", ["array", "tuple", "dict"])
def test_build_accepts_arrays_lists_and_dicts(saved_model, form):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    x = random_array((2, 16))
    item = {"array": x, "tuple": (x,), "dict": {"features": x}}[form]
    converter.build(input_fn=lambda: iter([item]))
    assert only_stats(converter)["builds"] == 1


def run_loaded(model_dir, feeds):
    """Load a converted SavedModel in a fresh process; returns (outputs per feed, engine op stats)."""
    code = f"""
import json, sys, numpy as np, tensorflow as tf
from tftrt_py import trt_convert as trt
fn = tf.saved_model.load({model_dir!r}).signatures["serving_default"]
outs = []
for feed in json.loads(sys.stdin.read()):
    res = fn(**{{k: tf.constant(np.array(v, dtype="float32")) for k, v in feed.items()}})
    outs.append({{k: v.numpy().tolist() for k, v in res.items()}})
print(json.dumps({{"outputs": outs, "stats": trt.engine_op_stats()}}))
"""
    result = run_json_process(code, [{k: v.tolist() for k, v in f.items()} for f in feeds])
    return result["outputs"], result["stats"]


def test_saved_engines_serve_the_first_request_after_load(saved_model, tmp_path):
    native = tf.saved_model.load(saved_model("small_cnn")).signatures["serving_default"]
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("small_cnn"))
    converter.convert()
    converter.build(input_fn=lambda: iter([random_array((4, 32, 32, 3))]))
    converter.save(str(tmp_path / "converted"))
    name = only_engine(converter)
    assert os.listdir(tmp_path / "converted" / "assets") == [f"trt-serialized-engine.{name}"]
    x = random_array((4, 32, 32, 3))
    (outputs,), stats = run_loaded(str(tmp_path / "converted"), [{"image": x}])
    assert stats[name]["builds"] == 0
    assert stats[name]["hits"] == 1
    np.testing.assert_allclose(outputs["output_0"], native(image=tf.constant(x))["output_0"].numpy(),
                               rtol=1e-5, atol=1e-5)


def test_save_before_build_stores_no_engines(saved_model, tmp_path):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    converter.save(str(tmp_path / "converted"))
    assert not os.path.exists(tmp_path / "converted" / "assets") or not os.listdir(tmp_path / "converted" / "assets")
    x = random_array((2, 16))
    (outputs,), stats = run_loaded(str(tmp_path / "converted"), [{"features": x}])
    assert stats[only_engine(converter)]["builds"] == 1  # built on first use instead


def test_native_segment_functions_leave_the_eager_context_with_the_last_function_using_them(saved_model, tmp_path):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    func = converter.convert()
    converter.save(str(tmp_path / "converted"))
    name = f"{only_engine(converter)}_native_segment"
    converter = None
    gc.collect()
    x = tf.constant(random_array((2, 16)))
    assert context.context().has_function(name)  # the function convert() returned still runs it
    func(features=x)
    func = None
    gc.collect()
    assert not context.context().has_function(name)


@pytest.mark.parametrize("max_engines, expected", [(1, dict(builds=3, evictions=2, hits=1)),
                                                   (2, dict(builds=3, evictions=1, hits=1))])
def test_engine_cache_evicts_least_recently_used(saved_model, max_engines, expected):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"),
                                        maximum_cached_engines=max_engines)
    func = converter.convert()
    original = tf.saved_model.load(saved_model("mlp")).signatures["serving_default"]
    for batch in (1, 2, 4, 2):  # the last batch 2 is served by an engine (batch 4 or 2) without a build
        x = tf.constant(random_array((batch, 16)))
        np.testing.assert_allclose(func(features=x)["scores"].numpy(), original(features=x)["scores"].numpy(),
                                   rtol=1e-5, atol=1e-6)
    stats = only_stats(converter)
    assert {k: stats[k] for k in expected} == expected
    assert stats["engines"] == max_engines and stats["fallback_total"] == 0


def test_no_engine_and_no_build_allowed_runs_the_native_segment(saved_model, tmp_path):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), allow_build_at_runtime=False)
    converter.convert()
    converter.build(input_fn=lambda: iter([random_array((2, 16))]))  # build() may still build
    converter.save(str(tmp_path / "converted"))
    x2, x8 = random_array((2, 16)), random_array((8, 16))
    original = tf.saved_model.load(saved_model("mlp")).signatures["serving_default"]
    (out2, out8), stats = run_loaded(str(tmp_path / "converted"), [{"features": x2}, {"features": x8}])
    stats = stats[only_engine(converter)]
    assert stats["builds"] == 0 and stats["hits"] == 1 and stats["fallbacks"] == {"no_engine": 1}
    np.testing.assert_allclose(out8["logits"], original(features=tf.constant(x8))["logits"].numpy(), rtol=1e-5,
                               atol=1e-5)


def test_failed_build_falls_back_and_is_remembered(saved_model, monkeypatch, caplog):
    import tftrt_py.convert.build as build_lib

    def broken(*args, **kwargs):
        raise RuntimeError("simulated build failure")

    monkeypatch.setattr(build_lib, "build_engine", broken)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    func = converter.convert()
    original = tf.saved_model.load(saved_model("mlp")).signatures["serving_default"]
    x = tf.constant(random_array((2, 16)))
    for _ in range(2):
        np.testing.assert_allclose(func(features=x)["logits"].numpy(), original(features=x)["logits"].numpy(),
                                   rtol=1e-5, atol=1e-5)
    stats = only_stats(converter)
    assert stats["build_failures"] == 1 and stats["fallbacks"] == {"build_failed": 2} and stats["engines"] == 0
    assert sum("simulated build failure" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_runtime_failure_falls_back(saved_model, monkeypatch):
    from tftrt_py.engine.runtime import ExecutionContext

    def broken(self, inputs, outputs=None):
        raise RuntimeError("simulated runtime failure")

    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    func = converter.convert()
    monkeypatch.setattr(ExecutionContext, "execute_v2", broken)
    x = tf.constant(random_array((2, 16)))
    original = tf.saved_model.load(saved_model("mlp")).signatures["serving_default"]
    np.testing.assert_allclose(func(features=x)["logits"].numpy(), original(features=x)["logits"].numpy(),
                               rtol=1e-5, atol=1e-5)
    assert only_stats(converter)["fallbacks"] == {"runtime_failure": 1}


def test_forbidden_fallback_is_an_error(saved_model, monkeypatch):
    import tftrt_py.convert.build as build_lib

    monkeypatch.setattr(build_lib, "build_engine", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    monkeypatch.setenv(engine_op.FALLBACK_ENV, "0")
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    func = converter.convert()
    with pytest.raises(tf.errors.AbortedError, match="User disallowed engine native segment execution"):
        func(features=tf.constant(random_array((2, 16))))


def test_concurrent_calls_get_right_answers(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("small_cnn"), maximum_cached_engines=4)
    func = converter.convert()
    original = tf.saved_model.load(saved_model("small_cnn")).signatures["serving_default"]
    inputs = [tf.constant(random_array((b, 32, 32, 3))) for b in (1, 2, 3, 2, 1, 3)]
    expected = [original(image=x)["output_0"].numpy() for x in inputs]
    results = {}

    def worker(i):
        for _ in range(3):
            results[i] = func(image=inputs[i])["output_0"].numpy()
    run_threads(worker, range(len(inputs)))
    for i, want in enumerate(expected):
        np.testing.assert_allclose(results[i], want, rtol=1e-5, atol=1e-5)


def test_summary_lists_engines_and_native_reasons(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("small_cnn"))
    with pytest.raises(RuntimeError, match="before calling"):
        converter.summary()
    converter.convert()
    lines = []
    converter.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert only_engine(converter) in text and "- Conv2D: 3x" in text
    inside, total = conversion_ratio(converter._converted_graph_def)
    assert f"[*] % of OPs Converted: {100.0 * inside / total:.2f}% [{inside}/{total}]" in text
    assert "Placeholder" in text and "graph input" in text
    assert f"[*] OPs left native: {total - inside}, by op type and reason:" in text  # one count throughout
    assert "nodes converted into" not in text
    with pytest.raises(ValueError, match="Minimum: 160"):
        converter.summary(line_length=100)


def failing_build(monkeypatch):
    """Every engine build fails the way a shape our converters cannot handle does (validate passed)."""
    import tftrt_py.convert.build as build_lib
    from tftrt_py.convert.errors import InvalidNodeError

    def broken(*args, **kwargs):
        raise InvalidNodeError("input 1 of Reshape must be known when building")

    monkeypatch.setattr(build_lib, "build_engine", broken)


def test_build_warns_about_each_engine_op_left_native(saved_model, monkeypatch, caplog):
    failing_build(monkeypatch)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    converter.build(input_fn=lambda: iter([(random_array((4, 16)),)]))
    name = only_engine(converter)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "no engine" in r.getMessage()]
    assert len(warnings) == 1
    assert name in warnings[0] and "[[4, 16]]" in warnings[0] and "must be known when building" in warnings[0]
    [(shapes, why)] = converter.native_engine_ops()[name].items()
    assert shapes == ((4, 16),) and "InvalidNodeError" in why


def test_summary_after_build_lists_engine_ops_running_natively(saved_model, monkeypatch):
    failing_build(monkeypatch)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    converter.build(input_fn=lambda: iter([(random_array((4, 16)),)]))
    lines = []
    converter.summary(print_fn=lines.append)
    text = "\n".join(lines)
    inside, total = conversion_ratio(converter._converted_graph_def)
    assert f"[*] % of OPs Converted: {100.0 * inside / total:.2f}% [{inside}/{total}]" in text  # TF-TRT's number
    assert f"[*] % of OPs running in engines for the shapes built: 0.00% [0/{total}]" in text
    assert f"[!] 1 engine op(s) ({inside} ops) run their native segment for shapes built:" in text
    assert f"{only_engine(converter)} ({inside} ops), input shapes [[4, 16]]: the engine build for [(4, 16)] " \
           "failed: InvalidNodeError: input 1 of Reshape must be known when building" in text


def test_summary_after_a_good_build_counts_every_converted_op_as_running(saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    lines = []
    converter.summary(print_fn=lines.append)
    assert not any("running in engines" in line for line in lines)  # no build(): nothing to say yet
    converter.build(input_fn=lambda: iter([(random_array((4, 16)),)]))
    lines = []
    converter.summary(print_fn=lines.append)
    inside, total = conversion_ratio(converter._converted_graph_def)
    assert f"[*] % of OPs running in engines for the shapes built: {100.0 * inside / total:.2f}% [{inside}/{total}]" \
        in lines
    assert not any(line.startswith("\n[!]") for line in lines) and converter.native_engine_ops() == {}


SEQ, HIDDEN, HEADS = 6, 16, 4


class HandWrittenAttention(tf.Module):
    """Self-attention as transformers write it: Dense layers as einsums, heads split by tf.shape-based
    reshapes; `mix_rows` subtracts the mean over the flattened batch [B*S, H] (rows then depend on each other)."""

    def __init__(self, mix_rows=False):
        rng = np.random.default_rng(7)
        self.w = [tf.Variable(rng.standard_normal((HIDDEN, HIDDEN)).astype("float32") * 0.3) for _ in range(3)]
        self.mix_rows = mix_rows

    @tf.function(input_signature=[tf.TensorSpec([None, SEQ, HIDDEN], tf.float32)])
    def __call__(self, x):
        batch, depth = tf.shape(x)[0], HIDDEN // HEADS
        q, k, v = (tf.transpose(tf.reshape(tf.einsum("bsh,hk->bsk", x, w), [batch, SEQ, HEADS, depth]), [0, 2, 1, 3])
                   for w in self.w)
        attention = tf.nn.softmax(tf.matmul(q, k, transpose_b=True) / np.sqrt(depth))
        out = tf.reshape(tf.transpose(tf.matmul(attention, v), [0, 2, 1, 3]), [batch * SEQ, HIDDEN])
        if self.mix_rows:
            out -= tf.reduce_mean(out, axis=0, keepdims=True)
        return tf.reshape(out, [batch, SEQ, HIDDEN]) + x


def keras_attention():
    import keras

    keras.utils.set_random_seed(8)
    x = keras.Input((SEQ, HIDDEN))
    y = keras.layers.MultiHeadAttention(HEADS, HIDDEN // HEADS)(x, x)
    return keras.Model(x, keras.layers.LayerNormalization()(y + x))


def converted_for_batch_8(model, tmp_path):
    if isinstance(model, tf.Module):
        tf.saved_model.save(model, str(tmp_path / "model"), signatures=model.__call__)
    else:
        model.export(str(tmp_path / "model"), verbose=False)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "model"))
    func = converter.convert()
    converter.build(input_fn=lambda: iter([(random_array((8, SEQ, HIDDEN)),)]))
    original = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
    return converter, func, original


def serve_and_compare(func, original, batch):
    x = tf.constant(random_array((batch, SEQ, HIDDEN)))
    (got,), (want,) = func(x).values(), original(x).values()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", [HandWrittenAttention, keras_attention], ids=["hand_written", "keras_mha"])
def test_attention_engines_serve_smaller_batches_row_wise(model, tmp_path):
    converter, func, original = converted_for_batch_8(model(), tmp_path)
    before = only_stats(converter)
    assert before["builds"] == 1 and before["engine_runs"] == 1
    for batch in (8, 3, 1):
        serve_and_compare(func, original, batch)
    stats = only_stats(converter)
    assert stats["builds"] == 1 and stats["engine_runs"] - before["engine_runs"] == 3
    assert stats["fallback_total"] == 0 and stats["evictions"] == 0


def test_an_engine_mixing_rows_of_the_flattened_batch_serves_only_its_batch(tmp_path):
    converter, func, original = converted_for_batch_8(HandWrittenAttention(mix_rows=True), tmp_path)
    for batch in (8, 3):
        serve_and_compare(func, original, batch)
    stats = only_stats(converter)
    assert stats["builds"] == 2 and stats["fallback_total"] == 0  # batch 3 got its own engine


class Int64Ids(tf.Module):
    """int64 token ids in and out of the engine (TF models often take int64 ids): offsets, a clip and a lookup."""

    def __init__(self):
        self.table = tf.constant(np.random.default_rng(3).normal(size=(50, 4)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 6], tf.int64, name="ids")])
    def serve(self, ids):
        shifted = tf.minimum(ids * 3 + 2, tf.constant(49, tf.int64))
        return {"shifted": shifted, "vectors": tf.gather(self.table, tf.cast(shifted, tf.int32)) * 2.0}


def test_int64_tensors_cross_the_engine_boundary(tmp_path):
    module = Int64Ids()
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    tf.saved_model.save(module, src, signatures={"serving_default": module.serve})
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src)
    func = converter.convert()
    (node,) = [n for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert tf.int64.as_datatype_enum in node.attr["InT"].list.type
    assert tf.int64.as_datatype_enum in node.attr["OutT"].list.type
    ids = tf.constant(np.random.default_rng(4).integers(0, 30, (3, 6)), tf.int64)
    converter.build(input_fn=lambda: iter([ids]))
    assert only_stats(converter)["builds"] == 1 and only_stats(converter)["fallback_total"] == 0
    converter.save(out)
    (got,), stats = run_loaded_ids(out, [ids.numpy()])
    want = module.serve(ids)
    assert got["shifted"]["dtype"] == "int64"
    np.testing.assert_array_equal(got["shifted"]["value"], want["shifted"].numpy())
    np.testing.assert_allclose(got["vectors"]["value"], want["vectors"].numpy(), rtol=1e-6)
    (op_stats,) = stats.values()
    assert op_stats["builds"] == 0 and op_stats["fallback_total"] == 0 and op_stats["engine_runs"] == 1


def run_loaded_ids(model_dir, feeds):
    """Serve int64 `ids` feeds from a converted SavedModel in a fresh process: (outputs with dtypes, stats)."""
    code = f"""
import json, sys, numpy as np, tensorflow as tf
from tftrt_py import trt_convert as trt
fn = tf.saved_model.load({model_dir!r}).signatures["serving_default"]
outs = [{{k: {{"dtype": v.dtype.name, "value": v.numpy().tolist()}}
          for k, v in fn(ids=tf.constant(np.array(f, dtype="int64"))).items()}}
        for f in json.loads(sys.stdin.read())]
print(json.dumps({{"outputs": outs, "stats": trt.engine_op_stats()}}))
"""
    result = run_json_process(code, [f.tolist() for f in feeds])
    return result["outputs"], result["stats"]


def test_timing_cache_passed_in_reaches_every_engine_build_and_comes_back(saved_model, tmp_path):
    cache = TimingCache()
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), timing_cache=cache)
    converter.convert()
    converter.build(input_fn=lambda: iter([random_array((2, 16))]))
    (key,) = fresh_segment_keys(converter)
    op = dispatcher.find(key.decode())
    assert converter.timing_cache is cache and op.builder_config().timing_cache is cache


def test_timing_cache_given_as_a_path_is_loaded_from_and_saved_to_it(saved_model, tmp_path):
    path = tmp_path / "cache.json"
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), timing_cache=str(path))
    assert isinstance(converter.timing_cache, TimingCache) and converter.timing_cache.path == str(path)


def test_timing_cache_false_builds_without_one_and_none_uses_the_process_default(saved_model, monkeypatch, tmp_path):
    assert trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), timing_cache=False).timing_cache is None
    monkeypatch.setenv("TFTRT_PY_TIMING_CACHE", str(tmp_path / "default.json"))
    default = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp")).timing_cache
    assert default is not None and default.path == str(tmp_path / "default.json")


def test_timing_cache_of_another_type_is_refused_saying_what_to_pass(saved_model):
    with pytest.raises(TypeError, match="pass a TimingCache, the path of a cache file, False"):
        trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), timing_cache=3)


@pytest.mark.parametrize("disabled, erfcs", [(False, 1), (True, 2)])
def test_tf_trts_test_switch_leaves_grappler_passes_out(tmp_path, disabled, erfcs):
    """TF-TRT's tests set _test_only_disable_non_trt_optimizers (DisableNonTrtOptimizers()): grappler's
    common-subexpression elimination, which merges two identical Erfc ops into one, does not run."""
    from tftrt_py.converters.summary import engine_op_counts

    module = tf.Module()
    module.f = tf.function(lambda x: tf.identity(tf.math.erfc(x) + tf.math.erfc(x) * 2.0, name="y"),
                           input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "model"), signatures=module.f)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "model"),
                                        conversion_params=trt.TrtConversionParams(minimum_segment_size=2))
    converter._test_only_disable_non_trt_optimizers = disabled
    func = converter.convert()
    (counts,) = engine_op_counts(converter._converted_graph_def).values()
    assert counts["Erfc"] == erfcs
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (y,) = func(tf.constant(x)).values()
    np.testing.assert_allclose(y.numpy(), tf.math.erfc(x).numpy() * 3.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision, warmed", [("FP32", "device"), ("FP16", "device"), ("INT8", "backend")])
def test_only_a_calibrating_conversion_loads_the_backend_while_the_model_loads(saved_model, monkeypatch, precision,
                                                                              warmed):
    """The others start only the GPU's driver and cupy then (warm_up_device); the calibrating one says which timing
    cache it builds with (the backend then knows whether its compile processes are worth starting ahead)."""
    started, cache = [], TimingCache()
    monkeypatch.setattr(converter_v2, "warm_up_backend", lambda timing_cache: started.append(("backend", timing_cache)))
    monkeypatch.setattr(converter_v2, "warm_up_device", lambda: started.append("device"))
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"), precision_mode=precision,
                                        timing_cache=cache)
    feed = [(random_array((2, 16)),)] if precision == "INT8" else None
    converter.convert(calibration_input_fn=(lambda: iter(feed)) if feed else None)
    assert started == [("backend", cache) if warmed == "backend" else warmed]
