"""Engine ops belong to one loaded model: another SavedModel carrying the same segment key (or a second load
of one) gets engine ops of its own, and engines built for another segment are refused."""
import numpy as np
import pytest
import tensorflow as tf

from sample_models import build_mlp
from tftrt_py import trt_convert as trt
from tftrt_py.converters import graph_io
from tftrt_py.engine_op import dispatcher, loading


def save_mlp(tmp_path, seed, segment_key=None):
    """An MLP of `seed`'s weights converted with engines built for batch 3 (segment key forced if given)."""
    obj, signatures = build_mlp(seed)
    src = str(tmp_path / f"mlp{seed}")
    tf.saved_model.save(obj, src, signatures=signatures)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src)
    converter.convert()
    if segment_key is not None:
        for node in converter._converted_graph_def.node:
            if node.op == "TRTEngineOp":
                node.attr["segment_key"].s = segment_key
        converter._converted_func = graph_io.function_from_graph_def(
            converter._func, converter._converted_graph_def, converter._input_names, converter._output_names)
    converter.build(lambda: [(tf.constant(np.zeros((3, 16), np.float32) + 0.5),)])
    out = str(tmp_path / f"trt{seed}")
    converter.save(out)
    key = next(n.attr["segment_key"].s for n in converter._converted_graph_def.node if n.op == "TRTEngineOp")
    return src, out, key


@pytest.fixture
def x():
    return tf.constant(np.random.default_rng(0).standard_normal((3, 16)).astype("float32"))


def serve(path, x):
    return tf.saved_model.load(path).signatures["serving_default"](features=x)["logits"].numpy()


def test_a_model_with_the_same_segment_key_does_not_take_over(tmp_path, x):
    src_a, trt_a, key = save_mlp(tmp_path, 0)
    src_b, trt_b, _ = save_mlp(tmp_path, 1, segment_key=key)
    model_a = tf.saved_model.load(trt_a).signatures["serving_default"]
    before = model_a(features=x)["logits"].numpy()
    np.testing.assert_allclose(before, serve(src_a, x), rtol=1e-5, atol=1e-5)
    model_b = tf.saved_model.load(trt_b).signatures["serving_default"]
    np.testing.assert_allclose(model_b(features=x)["logits"].numpy(), serve(src_b, x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model_a(features=x)["logits"].numpy(), before, rtol=1e-6, atol=1e-6)
    ops = [op for (k, _, _), op in dispatcher.engine_ops().items() if k == key.decode()]
    assert len(ops) == 2 and ops[0] is not ops[1]


def test_engines_of_another_segment_are_refused(tmp_path, x, caplog):
    _, trt_a, key = save_mlp(tmp_path, 0)
    src_b, trt_b, _ = save_mlp(tmp_path, 1)
    import os
    import shutil

    [asset_a] = os.listdir(os.path.join(trt_a, "assets"))
    [asset_b] = os.listdir(os.path.join(trt_b, "assets"))
    shutil.copy(os.path.join(trt_a, "assets", asset_a), os.path.join(trt_b, "assets", asset_b))  # A's engines
    with caplog.at_level("ERROR", logger=dispatcher.__name__):
        got = serve(trt_b, x)
    assert "built for another segment" in caplog.text
    np.testing.assert_allclose(got, serve(src_b, x), rtol=1e-5, atol=1e-5)


def test_save_refuses_a_non_empty_directory_and_its_input(tmp_path, saved_model):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty; pass overwrite=True"):
        converter.save(str(tmp_path / "out"))
    with pytest.raises(ValueError, match="would write into the input SavedModel"):
        converter.save(saved_model("mlp"), overwrite=True)
    converter.save(str(tmp_path / "out"), overwrite=True)
    assert (tmp_path / "out" / "saved_model.pb").exists()


def test_engines_from_another_models_assets_never_reach_a_loaded_op(tmp_path, x, caplog):
    """A crafted model whose engine op names a loaded model's native segment function shares that model's op
    (ops are keyed by segment key, function and binding): engines from its assets, even carrying the right
    binding, are refused, and the first model's answers stay as they were."""
    import os

    from tftrt_py.engine import Runtime
    from tftrt_py.engine_op.cache import pack_plans, unpack_plans

    src_a, trt_a, key = save_mlp(tmp_path, 0)
    model_a = tf.saved_model.load(trt_a).signatures["serving_default"]
    before = model_a(features=x)["logits"].numpy()
    [op] = [op for (k, _, _), op in dispatcher.engine_ops().items() if k == key.decode() and op.asset_paths]
    [asset] = os.listdir(os.path.join(trt_a, "assets"))
    with open(os.path.join(trt_a, "assets", asset), "rb") as f:
        plans = unpack_plans(f.read())
    forged = []
    for plan in plans:  # the same engine with every weight doubled, under the genuine binding
        engine = Runtime(backend="numpy").deserialize_cuda_engine(plan)
        for layer in engine.network.layers:
            for name, w in layer.weights.items():
                layer.weights[name] = w * 2
        forged.append(engine.serialize())
    path = tmp_path / "crafted.engines"
    path.write_bytes(pack_plans(forged))
    with caplog.at_level("ERROR", logger=loading.__name__):
        loading.load_assets(op, [str(path).encode()])
    assert "ignoring engines from" in caplog.text
    np.testing.assert_allclose(model_a(features=x)["logits"].numpy(), before, rtol=1e-6, atol=1e-6)
