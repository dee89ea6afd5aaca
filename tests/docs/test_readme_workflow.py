"""The README's TF2 workflow, run verbatim: convert, build and save in one process, then load, freeze with
``convert_variables_to_constants_v2`` and call in a fresh one, where the engines saved must serve (no build at the
first call, no native fallback) and the outputs match the original model's.

Besides the README's own CNN, the same convert and load blocks run on an Embedding + MultiHeadAttention model and
a keras-hub BERT, whose native segments the freeze step re-serializes with their nodes in another order.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from snippets import snippets

README = snippets("README.md")
STATS = "\nimport json\nprint('STATS ' + json.dumps(trt.engine_op_stats()))\n"


def _run(code: str, cwd) -> str:
    """Run `code` in a fresh Python with the engine backend users get by default; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TFTRT_PY_BACKEND"}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _inputs_prelude(dirs: str) -> str:
    """Defines the names the convert and load blocks read: the model directories and the inputs (saved by the
    export step as inputs.npz)."""
    return textwrap.dedent(f"""
        import numpy as np
        {dirs}
        inputs = dict(np.load("inputs.npz"))
    """)


MHA_EXPORT = """
import numpy as np
import keras

keras.utils.set_random_seed(0)
ids = keras.Input((16,), dtype="int32", name="ids")
x = keras.layers.Embedding(100, 32)(ids)
for _ in range(2):
    x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(2, 16)(x, x))
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(32)(keras.layers.Dense(64, activation="gelu")(x)))
model = keras.Model(ids, keras.layers.Dense(4, activation="softmax")(x[:, 0]))
input_saved_model_dir, output_saved_model_dir = "my_model", "my_model_trt"
model.export(input_saved_model_dir, verbose=False)
inputs = {"ids": np.random.default_rng(0).integers(0, 100, (8, 16)).astype(np.int32)}
"""

BERT_EXPORT = """
import numpy as np
import keras
import keras_hub

keras.utils.set_random_seed(0)
model = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=64,
                                      intermediate_dim=128, max_sequence_length=16)
input_saved_model_dir, output_saved_model_dir = "my_model", "my_model_trt"
model.export(input_saved_model_dir, verbose=False)
rng = np.random.default_rng(0)
inputs = {"token_ids": rng.integers(0, 100, (4, 16)).astype(np.int32),
          "segment_ids": rng.integers(0, 2, (4, 16)).astype(np.int32),
          "padding_mask": np.ones((4, 16), np.int32)}
"""

EXPORTS = {"readme_cnn": README["export"], "embedding_attention": MHA_EXPORT, "keras_hub_bert": BERT_EXPORT}


def test_readme_marks_the_tf2_workflow_blocks():
    assert {"export", "convert", "load"} <= set(README)
    assert "convert_variables_to_constants_v2(graph_func)" in README["load"]


@pytest.mark.parametrize("model", sorted(EXPORTS))
def test_saved_engines_serve_the_frozen_signature_in_a_fresh_process(model, tmp_path):
    if model == "keras_hub_bert":
        pytest.importorskip("keras_hub")
    dirs = 'input_saved_model_dir, output_saved_model_dir = "my_model", "my_model_trt"'
    save = "\nnp.savez('inputs.npz', **inputs)\n"
    _run(EXPORTS[model] + save + README["convert"], tmp_path)
    out = _run(_inputs_prelude(dirs) + README["load"] + STATS, tmp_path)
    stats = json.loads(out.split("STATS ", 1)[1])
    assert stats, "the loaded model has no engine op"
    for name, op in stats.items():
        assert op["builds"] == 0 and op["specialisations"] == 0, f"{name} rebuilt its engine: {op}"
        assert op["fallback_total"] == 0, f"{name} ran its native segment: {op}"
        assert op["engine_runs"] >= 1, f"{name} never ran: {op}"
