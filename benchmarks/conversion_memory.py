"""Peak memory and time of a conversion, stage by stage: load, convert, build, save, and what stays after the
converter is dropped, for a Keras application exported in another process (random weights, nothing downloaded).

    python benchmarks/conversion_memory.py [--model vgg16] [--batch 1] [--size 224] [--precision FP32] [--pooled]

RSS is sampled every 5 ms from /proc/self/statm; figures are above the RSS after importing TensorFlow and
tftrt_py, in GB, next to the model's weight bytes. As tftrt-convert does, the script sets
TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 (unless set) before TensorFlow allocates; --pooled leaves TensorFlow's oneDNN
allocator pooling what it frees (the default of a script importing TensorFlow on an x86 CPU).
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class Peak:
    """The highest RSS seen while a stage runs (a sampling thread)."""

    def __init__(self):
        self.value, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.005):
            self.value = max(self.value, rss())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.value = max(self.value, rss())


EXPORT = """
import sys, keras
if sys.argv[1] == "bert":  # keras-hub BERT-base, random weights
    import keras_hub
    keras.utils.set_random_seed(0)
    model = keras_hub.models.BertBackbone(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768,
                                          intermediate_dim=3072, dropout=0.0, max_sequence_length=512)
else:
    model = getattr(keras.applications, sys.argv[1])(weights=None, input_shape=(int(sys.argv[3]),) * 2 + (3,))
model.export(sys.argv[2], verbose=False)
print(sum(int(w.numpy().nbytes) for w in model.weights))
"""

APPS = {"vgg16": "VGG16", "resnet50": "ResNet50", "mobilenetv2": "MobileNetV2", "inceptionv3": "InceptionV3",
        "bert": "bert"}
SEQ = 128  # BERT's sequence length


def feed(model: str, batch: int, size: int):
    """One build input of `model`: numpy arrays by input name (BERT), or the image (a tuple)."""
    import numpy as np

    rng = np.random.default_rng(0)
    if model == "bert":
        return {"token_ids": rng.integers(1, 30522, (batch, SEQ)).astype(np.int32),
                "segment_ids": np.zeros((batch, SEQ), np.int32), "padding_mask": np.ones((batch, SEQ), np.int32)}
    return (rng.standard_normal((batch, size, size, 3)).astype(np.float32),)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vgg16", choices=sorted(APPS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--precision", default="FP32")
    parser.add_argument("--pooled", action="store_true", help="keep TensorFlow's oneDNN allocator pooling")
    args = parser.parse_args()
    if not args.pooled:
        from tftrt_py import settings

        settings.ONEDNN_SYSTEM_ALLOCATOR.set_default("1")
    tmp = tempfile.mkdtemp()
    try:
        _measure(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(args, tmp) -> None:
    from tftrt_py import settings

    src = os.path.join(tmp, "native")
    done = subprocess.run([sys.executable, "-c", EXPORT, APPS[args.model], src, str(args.size)], check=True,
                          capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    weights = int(done.stdout.split()[-1])

    from tftrt_py import trt_convert as trt

    gc.collect()
    base = rss()
    rows = []

    def stage(name, fn):
        start = time.perf_counter()
        with Peak() as peak:
            out = fn()
        rows.append((name, time.perf_counter() - start, peak.value - base, rss() - base))
        return out

    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=args.precision)
    converter = stage("init", lambda: trt.TrtGraphConverterV2(input_saved_model_dir=src,
                                                                        conversion_params=params))
    stage("convert", converter.convert)
    inputs = feed(args.model, args.batch, args.size)
    stage("build", lambda: converter.build(lambda: [inputs]))
    stage("save", lambda: converter.save(os.path.join(tmp, "trt")))

    def drop():
        nonlocal converter
        converter = None
        gc.collect()
    stage("converter dropped", drop)
    gb = 1 << 30
    allocator = settings.ONEDNN_SYSTEM_ALLOCATOR.raw()
    print(f"{args.model} ({weights / gb:.2f} GB of weights), batch {args.batch}, {args.precision}; RSS above "
          f"{base / gb:.2f} GB after imports; TF_ONEDNN_USE_SYSTEM_ALLOCATOR={allocator}")
    print(f"{'stage':<20} {'s':>7} {'peak GB':>8} {'x weights':>9} {'after GB':>9}")
    for name, seconds, peak, after in rows:
        print(f"{name:<20} {seconds:7.1f} {peak / gb:8.2f} {peak / weights:9.1f} {after / gb:9.2f}")


if __name__ == "__main__":
    main()
