"""Weights saved as constants pass TensorFlow's SavedModel writer as stand-ins and are written into saved_model.pb
after it (converters/saved_weights.py): the file holds them once, as Consts, its fingerprint matches it, and
functions the converter's own function shares keep their weights throughout."""
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

from support import saved_module
from tftrt_py import settings, trt_convert as trt
from tftrt_py.convert.graph import LARGE_CONST_BYTES
from tftrt_py.convert.segment_weights import fresh_function_name
from tftrt_py.converters import graph_io, saved_weights

RNG = np.random.default_rng(77)
WIDTH = 512  # a 1 MiB kernel: a variable a conversion keeps (variables.LARGE_VARIABLE_BYTES)


def function_with_weight(graph_def, name, value):
    fdef = graph_def.library.function.add()
    fdef.signature.name = name
    const = fdef.node_def.add(name="w", op="Const")
    const.attr["dtype"].type = tf.float32.as_datatype_enum
    const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return fdef


def test_only_the_functions_made_for_the_save_pass_the_writer_without_their_weights():
    graph_def = graph_pb2.GraphDef()
    value = np.ones((WIDTH, WIDTH), np.float32)
    assert value.nbytes >= LARGE_CONST_BYTES
    segment = fresh_function_name("TRTEngineOp_000_000_native_segment")
    for name in (segment, "tftrt_weights_0123", "TRTEngineOp_000_001_native_segment"):
        function_with_weight(graph_def, name, value)
    weights = saved_weights.stand_in_weights(graph_def, "tftrt_weights_0123")
    assert sorted(weights) == sorted([segment, "tftrt_weights_0123"])
    ops = {f.signature.name: [n.op for n in f.node_def] for f in graph_def.library.function}
    assert ops == {segment: ["Placeholder"], "tftrt_weights_0123": ["Placeholder"],
                   "TRTEngineOp_000_001_native_segment": ["Const"]}  # shared with the converted function: kept
    held = weights[segment]["w"].attr["value"].tensor
    np.testing.assert_array_equal(tf.make_ndarray(held), value)


class Dense(tf.Module):
    def __init__(self):
        self.kernel = tf.Variable(RNG.normal(0, 0.1, (WIDTH, WIDTH)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])
    def serve(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.kernel))}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model = Dense()
    return saved_module(model, model.serve, tmp_path_factory, "dense")


def test_the_saved_model_holds_the_weights_once_as_constants_its_fingerprint_matches_and_it_serves(
        model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(settings.KEEP_VARIABLES.name, str(1 << 29))  # (the default: this model saves constants)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    converter.convert()
    assert len(converter._variables) == 1  # the kernel, kept: the save makes it a constant (segment_weights)
    x = tf.constant(RNG.normal(0, 1, (4, WIDTH)).astype(np.float32))
    converter.build(input_fn=lambda: iter([(x,)]))
    out = str(tmp_path / "converted")
    converter.save(out)
    with open(os.path.join(out, "saved_model.pb"), "rb") as f:
        saved = saved_model_pb2.SavedModel.FromString(f.read())
    nodes = [n for f in saved.meta_graphs[0].graph_def.library.function for n in f.node_def]
    kernels = [n for n in nodes if n.op == "Const" and len(n.attr["value"].tensor.tensor_content) == WIDTH * WIDTH * 4]
    assert len(kernels) == 1 and not [n for n in nodes if n.op == "Placeholder"]
    assert graph_io._damage(out) == ""  # fingerprint.pb holds the checksum of the file as written last
    native = tf.saved_model.load(model_dir).signatures["serving_default"]
    served = tf.saved_model.load(out).signatures["serving_default"]
    for batch in (4, 2):
        y = tf.constant(RNG.normal(0, 1, (batch, WIDTH)).astype(np.float32))
        np.testing.assert_allclose(served(x=y)["y"].numpy(), native(x=y)["y"].numpy(), rtol=1e-5, atol=1e-5)
    assert converter._converted_func(x)["y"].shape == (4, WIDTH)  # the converter's own function still runs


def test_a_function_the_writer_did_not_write_is_an_error_that_says_how_to_save(tmp_path):
    out = str(tmp_path / "plain")
    tf.saved_model.save(Dense(), out)
    graph_def = graph_pb2.GraphDef()
    name = fresh_function_name("TRTEngineOp_000_000_native_segment")
    function_with_weight(graph_def, name, np.ones((WIDTH, WIDTH), np.float32))
    weights = saved_weights.stand_in_weights(graph_def, "tftrt_weights_0123")
    with pytest.raises(RuntimeError, match=f"no function '{name}'.*TFTRT_PY_KEEP_VARIABLES_BYTES=0"):
        saved_weights.write_weights(out, weights)
