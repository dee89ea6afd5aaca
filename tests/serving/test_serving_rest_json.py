"""REST bodies are parsed by orjson, and by json where orjson refuses what TF Serving accepts: NaN and Infinity
literals reach the model as IEEE values (outputs as the converted model computes them from those values)."""
import json
import os

import numpy as np
import tensorflow as tf

from support import random_array


def test_nan_and_infinity_literals_are_accepted(server, models):
    x = random_array((3, 16))
    x[0, 3], x[1, 5], x[2, 7] = np.nan, np.inf, -np.inf
    body = json.dumps({"inputs": x.tolist()}).encode()  # json writes NaN, Infinity, -Infinity
    assert b"NaN" in body and b"-Infinity" in body
    status, answer = server.rest.json("/v1/models/mlp:predict", raw=body)
    assert status == 200
    # the served model called in this process: native TF is no reference for NaN, its oneDNN fusion of MatMul,
    # BiasAdd and Relu (on by default on Intel CPUs) turns a NaN into 0 where its unfused kernels keep it
    served = tf.saved_model.load(os.path.join(models.root, "mlp", "2")).signatures["serving_default"]
    want = {k: v.numpy() for k, v in served(features=tf.constant(x)).items()}
    for name in want:
        np.testing.assert_allclose(np.array(answer["outputs"][name], np.float32), want[name], rtol=1e-5, atol=1e-5,
                                   equal_nan=True)
    assert np.isnan(np.array(answer["outputs"]["logits"])).any()  # the NaN reached the model
