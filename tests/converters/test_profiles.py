"""TrtGraphConverterV2 dynamic shapes: profile strategies, profile engines saved and restored, and the
allow_build_at_runtime / built-offline / forbidden-fallback matrix."""

import numpy as np
import pytest
import tensorflow as tf

from support import random_array, run_engine, run_json_process
from tftrt_py import trt_convert as trt
from tftrt_py.converters.profiles import make_profiles
from tftrt_py.engine import PlanError, Runtime
from tftrt_py.engine.profile import OptimizationProfile
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op.op import FALLBACK_ENV
from tftrt_py.engine_op.cache import unpack_plans


#: Shapes build() sees, on an input of shape [?, ?, ?, 1].
COLLECTED = [(1, 8, 8, 1), (2, 12, 12, 1), (1, 16, 16, 1), (4, 16, 16, 1)]
#: Per strategy: engines and specialisations after build(), as the README documents.
#: Range: one profile [1,8,8,1]..[4,16,16,1], specialised for 8x8, 12x12 and 16x16 at batch 4 (which, row-wise,
#: also serves batch 1). Optimal: one profile per shape. Range+Optimal: both; the collected shapes run on
#: their Optimal engines, the Range one holds its opt shape. ImplicitBatchModeCompatible: batch 1..max per
#: distinct non-batch shape (8x8 up to 1, 12x12 up to 2, 16x16 up to 4).
AFTER_BUILD = {"Range": (1, 3), "Optimal": (4, 4), "Range+Optimal": (5, 5), "ImplicitBatchModeCompatible": (3, 3)}
#: A shape inside the Range profile that build() did not see, and how each strategy serves it:
#: "specialise" (inside a profile: a new specialisation of that profile engine) or "build" (a new engine).
UNSEEN = (3, 10, 10, 1)
UNSEEN_SERVED_BY = {"Range": "specialise", "Optimal": "build", "Range+Optimal": "specialise",
                    "ImplicitBatchModeCompatible": "build"}


class SpatialNet(tf.Module):
    """Two convolutions on an image of any size: input [?, ?, ?, 1]."""

    def __init__(self):
        rng = np.random.default_rng(11)
        self.k1 = tf.Variable(rng.normal(0, 0.3, (3, 3, 1, 4)).astype("float32"))
        self.k2 = tf.Variable(rng.normal(0, 0.3, (3, 3, 4, 4)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, 1], tf.float32, name="image")])
    def serve(self, image):
        x = tf.nn.relu(tf.nn.conv2d(image, self.k1, 1, "SAME"))
        return {"out": tf.nn.relu(tf.nn.conv2d(x, self.k2, 1, "SAME")) * 2.0}


@pytest.fixture(scope="module")
def spatial_model(tmp_path_factory):
    module = SpatialNet()
    path = str(tmp_path_factory.mktemp("spatial") / "model")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path, module


def engine_op(converter):
    (node,) = [n for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    return node.name, dispatcher.find(node.attr["segment_key"].s.decode())


def counts(op):
    return len(op.cache), op.stats.specialisations


def inputs(shapes):
    return lambda: iter([random_array(s) for s in shapes])


def converted(model_dir, strategy="Range", build=True, **kwargs):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=True,
                                        dynamic_shape_profile_strategy=strategy, maximum_cached_engines=8, **kwargs)
    func = converter.convert()
    if build:
        converter.build(input_fn=inputs(COLLECTED))
    return converter, func


def check(func, module, shape):
    x = tf.constant(random_array(shape))
    np.testing.assert_allclose(func(image=x)["out"].numpy(), module.serve(x)["out"].numpy(), rtol=1e-5, atol=1e-5)


def test_strategies_make_the_documented_profiles():
    collected = [(s,) for s in COLLECTED]
    (rng,) = make_profiles("Range", collected)
    assert rng == OptimizationProfile([(1, 8, 8, 1)], [(4, 16, 16, 1)], [(4, 16, 16, 1)])
    optimal = make_profiles("Optimal", collected + collected[:1])  # duplicates count once
    assert [p.min for p in optimal] == [p.max for p in optimal] == collected
    assert make_profiles("Range+Optimal", collected) == optimal + [rng]
    assert make_profiles("ImplicitBatchModeCompatible", collected) == [
        OptimizationProfile([(1,) + s], [(b,) + s], [(b,) + s])
        for b, s in ((1, (8, 8, 1)), (2, (12, 12, 1)), (4, (16, 16, 1)))]
    assert make_profiles("range", collected) == [rng] and make_profiles("Range", []) == []
    # TF-TRT's ImplicitBatchModeCompatible takes inputs of other leading dims, and scalars, as they come
    assert make_profiles("ImplicitBatchModeCompatible", [((4, 3), (2,), ()), ((1, 3), (1,), ())]) == [
        OptimizationProfile([(1, 3), (1,), ()], [(4, 3), (2,), ()], [(4, 3), (2,), ()])]
    with pytest.raises(ValueError, match="profile_strategy 'Widest' is not supported"):
        make_profiles("Widest", collected)


@pytest.mark.parametrize("strategy", trt.supported_profile_strategies())
def test_each_strategy_builds_the_documented_engines(spatial_model, strategy):
    model_dir, module = spatial_model
    converter, func = converted(model_dir, strategy)
    _, op = engine_op(converter)
    assert counts(op) == AFTER_BUILD[strategy]
    assert op.stats.hits == op.stats.engine_runs == 0 and not op.stats.fallbacks  # build() ran natively
    for shape in COLLECTED:  # every collected shape is served as built: no build, no specialisation
        check(func, module, shape)
    assert counts(op) == AFTER_BUILD[strategy] and op.stats.hits == len(COLLECTED)
    check(func, module, UNSEEN)
    engines, specialisations = AFTER_BUILD[strategy]
    assert counts(op) == ((engines, specialisations + 1) if UNSEEN_SERVED_BY[strategy] == "specialise"
                          else (engines + 1, specialisations))
    assert not op.stats.fallbacks


def test_implicit_batch_profiles_serve_every_batch_up_to_the_largest(spatial_model):
    model_dir, module = spatial_model
    converter, func = converted(model_dir, "ImplicitBatchModeCompatible")
    _, op = engine_op(converter)
    for shape in [(3, 16, 16, 1), (2, 16, 16, 1), (1, 12, 12, 1)]:
        check(func, module, shape)
    assert counts(op) == AFTER_BUILD["ImplicitBatchModeCompatible"]  # inside the profiles: nothing new
    check(func, module, (3, 12, 12, 1))  # batch 3 is above the 12x12 profile's max
    assert len(op.cache) == 4 and op.stats.builds == 4


def test_profile_engines_are_saved_with_their_profiles(spatial_model, tmp_path):
    model_dir, _ = spatial_model
    converter, _ = converted(model_dir, "Range")
    converter.save(str(tmp_path / "out"))
    name, _ = engine_op(converter)
    with open(tmp_path / "out" / "assets" / f"trt-serialized-engine.{name}", "rb") as f:
        engines = [Runtime().deserialize_cuda_engine(p) for p in unpack_plans(f.read())]
    assert len(engines) == AFTER_BUILD["Range"][1]
    assert {e.profile for e in engines} == set(make_profiles("Range", [(s,) for s in COLLECTED]))


def test_plans_record_the_profile_and_reject_a_bad_one():
    engine, _ = run_engine(lambda x: tf.nn.relu(x) * 2.0, [random_array((2, 3))])
    profile = OptimizationProfile([(1, 3)], [(2, 3)], [(4, 3)])
    engine.profile = profile
    restored = Runtime().deserialize_cuda_engine(engine.serialize())
    assert restored.profile == profile and profile.contains([(3, 3)]) and not profile.contains([(5, 3)])

    class Bad:
        def as_dict(self):
            return {"min": [[1, 3]], "opt": [[8, 3]], "max": [[4, 3]]}

    engine.profile = Bad()
    with pytest.raises(PlanError, match="profile"):
        Runtime().deserialize_cuda_engine(engine.serialize())


def run_loaded(jobs, env=None):
    """Load each converted SavedModel of `jobs` ({dir: input shapes}) in one fresh process and serve its shapes
    there; returns (engine op stats by name, {dir: error messages})."""
    code = """
import json, sys, numpy as np, tensorflow as tf
from tftrt_py import trt_convert as trt
errors = {}
for model_dir, shapes in json.loads(sys.stdin.read()).items():
    fn = tf.saved_model.load(model_dir).signatures["serving_default"]
    for shape in shapes:
        try:
            fn(image=tf.constant(np.random.rand(*shape).astype("float32")))
        except tf.errors.OpError as exc:
            errors.setdefault(model_dir, []).append(exc.message)
print(json.dumps({"stats": trt.engine_op_stats(), "errors": errors}))
"""
    result = run_json_process(code, jobs, **(env or {}))
    return result["stats"], result["errors"]


IN_PROFILE, OUTSIDE = (1, 8, 8, 1), (1, 20, 20, 1)  # the Range profile is [1,8,8,1]..[4,16,16,1]

#: (built offline, allow_build_at_runtime) -> what serving IN_PROFILE then OUTSIDE after loading does.
MATRIX = {
    (True, True): dict(builds=1, specialisations=0, hits=1, engines=2, fallbacks={}),  # OUTSIDE builds
    (True, False): dict(builds=0, specialisations=0, hits=1, engines=1, fallbacks={"no_engine": 1}),
    (False, True): dict(builds=2, specialisations=0, hits=0, engines=2, fallbacks={}),
    (False, False): dict(builds=0, specialisations=0, hits=0, engines=0, fallbacks={"no_engine": 2}),
}


def test_allow_build_at_runtime_and_built_offline(spatial_model, tmp_path):
    model_dir, _ = spatial_model
    names, jobs = {}, {}
    for built, allow_build in MATRIX:
        converter, _ = converted(model_dir, "Range", build=built, allow_build_at_runtime=allow_build)
        out = str(tmp_path / f"built_{built}_allow_{allow_build}")
        converter.save(out)
        names[(built, allow_build)] = engine_op(converter)[0]
        jobs[out] = [IN_PROFILE, OUTSIDE]
    stats, errors = run_loaded(jobs)
    assert not errors
    for case, expected in MATRIX.items():
        got = {k: stats[names[case]][k] for k in expected}
        assert got == expected, case


def test_forbidden_fallback_is_an_error(spatial_model, tmp_path):
    model_dir, _ = spatial_model
    converter, _ = converted(model_dir, "Range", allow_build_at_runtime=False)
    converter.save(str(tmp_path / "out"))
    shapes = [IN_PROFILE, (2, 9, 11, 1), OUTSIDE]  # two inside the profile (one new to it), one outside
    stats, errors = run_loaded({str(tmp_path / "out"): shapes}, env={FALLBACK_ENV: "0"})
    (error,) = errors[str(tmp_path / "out")]
    assert "User disallowed engine native segment execution" in error
    stats = stats[engine_op(converter)[0]]
    assert stats["hits"] == 2 and stats["specialisations"] == 1 and stats["fallbacks"] == {"no_engine": 1}


def test_static_shapes_mode_is_unchanged_without_use_dynamic_shape(spatial_model):
    model_dir, module = spatial_model
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, maximum_cached_engines=8)
    func = converter.convert()
    converter.build(input_fn=inputs(COLLECTED))
    _, op = engine_op(converter)
    assert len(op.cache) == 4 and op.stats.specialisations == 0  # one engine per collected shape
    check(func, module, (3, 16, 16, 1))  # a smaller batch runs on the batch-4 engine (row-wise)
    check(func, module, UNSEEN)
    assert op.stats.builds == 5
