"""The GPU benchmark's BERT encoder layer (gpu_bert, narrower) on the numpy backend: attention (packed heads) and
both LayerNorms (with their residual sums and affines) fuse, computing what the unfused build computes."""
from unittest import mock

import gpu_bert as bert
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Runtime, builder
from tftrt_py.engine.builder.fusions.match import fusion_counts

MODEL = bert.spec(hidden=64, heads=4, ffn=128)
FUSIONS = ("layer normalization fusion", "attention fusion")
X = np.random.default_rng(9).standard_normal((2, 16, 64)).astype(np.float32)


def network(dtype="float32"):
    return bert.network(batch=2, seq=16, model=MODEL, dtype=dtype)


def build(precision="FP32", fused=True, net=None, dtype="float32"):
    pipeline = builder.PIPELINE if fused else [p for p in builder.PIPELINE if p[0] not in FUSIONS]
    late = builder.LATE_PASSES if fused else []  # unfused: the residual sums stay sums
    with mock.patch.object(builder, "PIPELINE", pipeline), mock.patch.object(builder, "LATE_PASSES", late):
        return Builder(BuilderConfig(precision=precision)).build_engine(net or network(dtype))


def kinds(engine):
    return [l.kind for l in engine.network.layers if l.kind != "Constant"]


def run(engine):
    return engine.create_execution_context().execute({"x": X.astype(engine.network.inputs[0].dtype)})["y"]


@pytest.mark.parametrize("dtype, eps, unfused", [("float32", bert.EPS, 34), ("float16", 0.0, 32)])  # fp16: 1e-12 is 0
def test_attention_and_layer_norms_fuse(dtype, eps, unfused):
    assert len(kinds(build(fused=False, dtype=dtype))) == unfused
    engine = build(dtype=dtype)
    assert kinds(engine) == ["Shuffle", "MatrixMultiply", "Shuffle", "Attention", "Shuffle", "MatrixMultiply",
                             "Normalization", "MLP", "Normalization", "Shuffle"]
    counts = fusion_counts(engine.network)
    assert [counts[r] for r in ("attention", "layer normalization", "Normalization + residual sum",
                                "Normalization + Scale")] == [1, 2, 2, 2]
    attention = next(l for l in engine.network.layers if l.kind == "Attention")
    qkv = next(l for l in engine.network.layers if l.kind == "MatrixMultiply").outputs[0]  # fused Q/K/V, read in place
    assert attention.params == {"scale": 0.25, "heads": 4, "columns": [[0, 64], [64, 64], [128, 64]]}
    assert {t.producer.inputs[0].name for t in attention.inputs} == {qkv.name}
    norms = [l for l in engine.network.layers if l.kind == "Normalization"]
    for norm, key in zip(norms, ("ln1", "ln2")):
        assert len(norm.inputs) == 2 and norm.params["epsilon"] == pytest.approx(eps)
        np.testing.assert_array_equal(norm.weights["scale"], MODEL[key][0])
        np.testing.assert_array_equal(norm.weights["bias"], MODEL[key][1])


@pytest.mark.parametrize("precision, dtype, tolerance", [("FP32", "float32", 1e-5), ("FP16", "float32", 1e-2),
                                                      ("FP16", "float16", 1e-2)])
def test_fused_layer_matches_the_unfused_build(precision, dtype, tolerance):
    np.testing.assert_allclose(run(build(precision, dtype=dtype)), run(build(precision, fused=False, dtype=dtype)),
                               rtol=tolerance, atol=tolerance)


def test_fused_layers_run_in_int8_where_they_have_kernels_and_survive_a_plan():
    """Every tensor with a range: the GEMMs and the attention run INT8 (the attention reads the fused QKV
    projection, whose range is its q, k and v's), the LayerNorms FP16."""
    net = network()
    for t in net.inputs + [t for l in net.layers for t in l.outputs]:
        t.dynamic_range = 4.0
    engine = build("INT8", net=net)
    precision = {l.kind: l.precision for l in engine.network.layers}
    assert precision["Attention"] == precision["MatrixMultiply"] == "INT8" and precision["Normalization"] == "FP16"
    attention = next(l for l in engine.network.layers if l.kind == "Attention")
    assert [t.dynamic_range for t in attention.inputs] == [4.0] * 3
    assert {l.kind: l.precision for l in build("FP16").network.layers}["Attention"] == "FP16"
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    np.testing.assert_array_equal(run(loaded), run(engine))
