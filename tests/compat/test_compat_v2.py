"""TF-TRT's integration-test expectations for TrtGraphConverterV2: engines, removed nodes, engine op attributes
and outputs, in implicit-batch (static) and dynamic-shape modes, FP32, FP16 and INT8 with calibration."""
import numpy as np
import pytest
import tensorflow as tf

from cases import BY_NAME, CASES
from harness import TOLERANCE, Converted, case_ops, save_case

MODES = {"static": {}, "dynamic": dict(dynamic=True, strategy="Range")}


def case_params(names=None):
    return [c.name for c in CASES if names is None or c.name in names]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = save_case(BY_NAME[name], str(tmp_path_factory.mktemp(name)))
        return cache[name]
    return get


def check(converted, precision, dynamic):
    case = converted.case
    assert set(converted.engines) == set(case.engines)
    original = case_ops(case)
    remaining = converted.graph_nodes()
    # Which segment gets index 000 is not checked: TF-TRT numbers them in its segmenter's map order.
    expected_ops = {frozenset(n for n in e if original.get(n) != "Const"): e for e in case.engines.values()}
    for engine in converted.engines:
        ops, consts = converted.segment_nodes(engine)
        assert frozenset(ops) in expected_ops, (engine, ops)
        assert {n for n in expected_ops[frozenset(ops)] if original.get(n) == "Const"} <= consts, engine
        assert not ops & remaining  # converted nodes are gone from the graph
        node = converted.engines[engine]
        assert node.attr["precision_mode"].s.decode() == precision
        assert node.attr["use_calibration"].b is True and not node.attr["static_engine"].b
        assert node.attr["profile_strategy"].s.decode().lower() == ("range" if dynamic
                                                                   else "implicitbatchmodecompatible")
        assert bool(node.attr["calibration_data"].s) == (precision == "INT8")
        for shape in list(node.attr["input_shapes"].list.shape) + list(node.attr["output_shapes"].list.shape):
            assert tf.TensorShape(shape).as_list()[0] is None  # the batch dim stays unknown
    assert case.native <= remaining
    for batch in case.batches:
        got, want = converted.outputs(case.inputs(batch))
        for g, w in zip(got, want):
            tol = TOLERANCE[precision] * max(1.0, float(np.abs(w).max()))
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", case_params())
def test_fp32(saved, name, mode):
    check(Converted(BY_NAME[name], saved(name), "FP32", **MODES[mode]), "FP32", mode == "dynamic")


@pytest.mark.parametrize("name", case_params(["conv_bias_relu", "matmul_biasadd", "split_by_unsupported"]))
@pytest.mark.parametrize("precision", ["FP16", "INT8"])
def test_reduced_precision(saved, name, precision):
    check(Converted(BY_NAME[name], saved(name), precision), precision, False)


def test_inputs_outside_the_signatures_static_dims_run(tmp_path):
    """TF-TRT's test model (signature [None, 1, 1] twice) built and served with [4, 2, 1] inputs."""
    class Model(tf.Module):
        def __init__(self):
            self.v = tf.Variable([[[1.0]]])

        @tf.function(input_signature=[tf.TensorSpec([None, 1, 1], tf.float32)] * 2)
        def run(self, inp1, inp2):
            add = inp1 + self.v
            return tf.identity(inp1 * add + add + inp2, name="output")

    model = Model()
    tf.saved_model.save(model, str(tmp_path), signatures=model.run)
    from tftrt_py import trt_convert as trt

    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path))
    func = converter.convert()
    x1, x2 = (np.random.default_rng(i).normal(size=(4, 2, 1)).astype(np.float32) for i in range(2))
    converter.build(input_fn=lambda: iter([(x1, x2)]))
    (out,) = func(tf.constant(x1), tf.constant(x2)).values()
    np.testing.assert_allclose(out.numpy(), x1 * (x1 + 1) + (x1 + 1) + x2, rtol=1e-5, atol=1e-5)
    (name,) = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert trt.engine_op_stats()[name]["engine_runs"] == 2 and trt.engine_op_stats()[name]["fallback_total"] == 0
