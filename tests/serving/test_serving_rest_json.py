"""REST bodies are parsed by orjson, and by json where orjson refuses what TF Serving accepts: NaN and Infinity
literals reach the model as IEEE values (outputs as native TF computes them)."""
import json

import numpy as np

from conftest import reference
from support import random_array


def test_nan_and_infinity_literals_are_accepted(server, models):
    x = random_array((3, 16))
    x[0, 3], x[1, 5], x[2, 7] = np.nan, np.inf, -np.inf
    body = json.dumps({"inputs": x.tolist()}).encode()  # json writes NaN, Infinity, -Infinity
    assert b"NaN" in body and b"-Infinity" in body
    status, answer = server.rest.json("/v1/models/mlp:predict", raw=body)
    assert status == 200
    want = reference(models, "mlp", 2, features=x)
    for name in want:
        np.testing.assert_allclose(np.array(answer["outputs"][name], np.float32), want[name], rtol=1e-5, atol=1e-5,
                                   equal_nan=True)
    assert np.isnan(np.array(answer["outputs"]["logits"])).any()  # the NaN reached the model
