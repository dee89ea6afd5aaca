"""The engine and its stand-alone runtime import and run without TensorFlow."""
import subprocess
import sys

CODE = """
import sys, numpy as np
import tftrt_py.engine as e
net = e.Network(); x = net.add_input("x", "float32", (1, 2))
net.mark_output(net.add_layer("Activation", [x], {"type": "relu"}).outputs[0])
engine = e.Runtime().deserialize_cuda_engine(e.Builder().build_engine(net).serialize())
engine.create_execution_context().execute_v2([np.ones((1, 2), "float32")])
assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if m.startswith("tensorflow"))
"""


def test_engine_runs_without_importing_tensorflow():
    subprocess.run([sys.executable, "-c", CODE], check=True)
