"""Memory of a whole conversion (convert, build, save) of a model whose weights dominate, in a fresh process: the peak
resident memory above the process's after its imports, in multiples of the weights, and what stays after the
converter is dropped."""
import pytest

from support import run_json_process

pytestmark = pytest.mark.slow

CONVERSION = r"""
import gc, json, os, sys, tempfile, threading
import numpy as np, tensorflow as tf
from tftrt_py import trt_convert as trt
from tftrt_py.converters.memory import release_freed_memory
from tftrt_py.engine_op import library
from tftrt_py.engine_op.op import engine_backend

page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

args = json.load(sys.stdin)
layers, width = args["layers"], args["width"]

class Stack(tf.Module):
    def __init__(self):
        rng = np.random.default_rng(0)
        self.w = [tf.Variable(rng.standard_normal((width, width)).astype(np.float32) * 0.02) for _ in range(layers)]

    @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32)])
    def serve(self, x):
        for w in self.w:
            x = tf.nn.relu(tf.matmul(x, w))
        return {"y": x}

src = os.path.join(tempfile.mkdtemp(), "stack")
stack = Stack()
tf.saved_model.save(stack, src, signatures=stack.serve)
del stack
library.load()  # the TRTEngineOp library and the engines' backend count as imports, not as the conversion's
engine_backend()
release_freed_memory()  # the baseline without the export's freed heap
base, peak, done = rss(), [0], threading.Event()
def sample():
    while not done.wait(0.005):
        peak[0] = max(peak[0], rss())
threading.Thread(target=sample, daemon=True).start()
converter = trt.TrtGraphConverterV2(input_saved_model_dir=src)
converter.convert()
converter.build(lambda: [(np.ones((4, width), np.float32),)])
converter.save(os.path.join(tempfile.mkdtemp(), "converted"))
converter = None
gc.collect()
done.set()
weights = layers * width * width * 4
print(json.dumps({"peak": (max(peak[0], rss()) - base) / weights, "held": (rss() - base) / weights}))
"""


def test_converting_a_model_of_large_weights_peaks_below_a_bound_and_gives_the_memory_back():
    # 96 MiB of float32 weights in 6 Dense layers, kept as variables: their memory, the copy ONNX Runtime prepacks
    # them into (its sessions read the layers' own arrays, no copy of their own) and the one it takes while it makes
    # a session. TensorFlow's oneDNN allocator (on by default on x86 CPUs) would
    # pool what TensorFlow frees, so it runs with the system allocator here, as tftrt-convert does
    measured = run_json_process(CONVERSION, {"layers": 6, "width": 2048}, TF_ONEDNN_USE_SYSTEM_ALLOCATOR="1",
                                TFTRT_PY_KEEP_VARIABLES_BYTES="0")  # 96 MiB: below the default 512 MiB
    assert measured["peak"] <= 3, measured
    assert measured["held"] <= 0.5, measured
