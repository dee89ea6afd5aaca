"""Native TensorFlow against converted models on the CPU, per engine backend, in one run.

    python benchmarks/cpu_vs_tf.py [--models cnn,resnet50,mobilenetv2,bert,vit,mlp,lstm,lstm_any_length,zoo]
                                   [--batches 1,8] [--backends onnxruntime,numpy] [--compile-native-loops]
                                   [--json out.json]

Models (random weights, nothing downloaded): the demo CNN, Keras ResNet50 and MobileNetV2, a keras-hub BERT-base
encoder (sequence 128, padded masks), ViT-B/16, keras-hub DeepLabV3 on a ResNet-18, an MLP (Dense 64 -> 64
relu -> 10) so small that its times are the per-call cost of a converted call against native TF's, and a Keras
LSTM text classifier (128 steps of 256 units; its loop is unrolled into the engine), the same over sequences of any
length (``lstm_any_length``, fed 128 steps: its loop stays a loop, compiled by XLA with ``--compile-native-loops``,
which passes compile_native_loops=True to the converter). ``zoo:NAME``
is a model of the zoo the tests hold to their targets (tests/zoo/models.py REQUIRED: its builder, exporter and
feeds, at its own input sizes with the batch replaced), ``zoo`` all of them; the default leaves the zoo out.
Each is exported, converted (engines built for every batch), saved; a fresh process per engine backend
(onnxruntime when importable, numpy) loads the converted SavedModel and times its serving signature between two
timings of native TF's: per model and batch, TF ms, converted ms, speed-up and the largest difference from TF's
outputs. Then:

- INT8: ResNet50 and BERT calibrated through the converter, served by onnxruntime, against their FP32 engines (its
  integer matrix multiplies take uint8 x int8 sums where the CPU has VNNI or AMX); a CNN trained
  on scikit-learn's digits, its test accuracy in TF, converted FP32 and converted INT8 (the issue's bar: INT8
  >= 1.3x FP32 on ResNet50 with the digits accuracy within 1 point);
- OpenVINO against ONNX Runtime on the same ONNX model (the largest ResNet50 and BERT engines lowered by
  onnxruntime.lowering.lower; ONNX Runtime's session as the backend makes it, OpenVINO with the threads
  backends.threads.cpu_threads allows).

Times are medians of single calls (served_gpu.timed); TensorFlow's threads stay at their defaults.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "models"), os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402

from served_gpu import bert_feed, bert_keras, timed  # noqa: E402
from zoo.models import REQUIRED as ZOO_REQUIRED  # noqa: E402
from zoo.models import export as zoo_export  # noqa: E402
from zoo.models import make_feed  # noqa: E402

BACKENDS = ("onnxruntime", "numpy")


# -- models -----------------------------------------------------------------------------------------------------
def _keras_export(build):
    def export(directory: str, size: int) -> None:
        import keras

        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        build(size).export(directory, verbose=False)
    return export


def _cnn(size):
    from sample_models import build_small_cnn

    return build_small_cnn()[0]


def _application(cls_name):
    def build(size):
        import keras

        # logits, not probabilities: a saturated softmax would hide differences
        return getattr(keras.applications, cls_name)(weights=None, input_shape=(size, size, 3),
                                                     classifier_activation=None)
    return build


def _vit(size):
    import keras_hub

    return keras_hub.models.ViTBackbone(image_shape=(size, size, 3), patch_size=16, num_layers=12, num_heads=12,
                                        hidden_dim=768, mlp_dim=3072)


def _deeplabv3(size):
    """keras-hub DeepLabV3 (its atrous spatial pyramid pooling, dilations 6, 12, 18) on a ResNet-18 backbone."""
    import keras_hub

    encoder = keras_hub.models.ResNetBackbone(input_conv_filters=[64], input_conv_kernel_sizes=[7],
                                              stackwise_num_filters=[64, 128, 256, 512],
                                              stackwise_num_blocks=[2, 2, 2, 2], stackwise_num_strides=[1, 2, 2, 2],
                                              block_type="basic_block", image_shape=(size, size, 3))
    backbone = keras_hub.models.DeepLabV3Backbone(image_encoder=encoder, spatial_pyramid_pooling_key="P5",
                                                  upsampling_size=8, dilation_rates=[6, 12, 18],
                                                  low_level_feature_key="P2", image_shape=(size, size, 3))
    return keras_hub.models.DeepLabV3ImageSegmenter(backbone=backbone, num_classes=21)


def _mlp(size):
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


def _lstm_classifier(steps):
    """A text classifier as users build one: 10,000-token embeddings of 128 wide, an LSTM of 256 units over `steps`
    steps, a softmax over 2 classes."""
    def build(size):
        import keras

        tokens = keras.Input((steps,), dtype="int32", name="token_ids")
        x = keras.layers.LSTM(256)(keras.layers.Embedding(10000, 128)(tokens))
        return keras.Model(tokens, keras.layers.Dense(2, activation="softmax")(x))
    return build


#: The sequence length fed where a model takes any (lstm_any_length).
SEQUENCE = 128


def token_feed(batch: int, rng, specs) -> dict:
    """The lone integer input: `batch` rows of token ids below 10,000 (SEQUENCE of them where any length goes)."""
    (name, spec), = specs.items()
    shape = [SEQUENCE if d is None else d for d in spec.shape.as_list()[1:]]
    return {name: rng.integers(0, 10000, (batch, *shape)).astype(np.int32)}


def uniform_feed(batch: int, rng, specs) -> dict:
    """The lone float input, values uniform in [-1, 1), `batch` rows of the signature's other dims."""
    (name, spec), = specs.items()
    return {name: rng.uniform(-1, 1, (batch, *spec.shape.as_list()[1:])).astype(np.float32)}


MODELS = {
    "cnn": dict(export=_keras_export(_cnn), feed=uniform_feed),
    "resnet50": dict(export=_keras_export(_application("ResNet50")), feed=uniform_feed),
    "mobilenetv2": dict(export=_keras_export(_application("MobileNetV2")), feed=uniform_feed),
    "bert": dict(export=lambda directory, size: bert_keras(directory), feed=lambda b, rng, specs: bert_feed(b, rng)),
    "vit": dict(export=_keras_export(_vit), feed=uniform_feed),
    "deeplabv3": dict(export=_keras_export(_deeplabv3), feed=uniform_feed),
    "mlp": dict(export=_keras_export(_mlp), feed=uniform_feed),
    "lstm": dict(export=_keras_export(_lstm_classifier(SEQUENCE)), feed=token_feed),
    "lstm_any_length": dict(export=_keras_export(_lstm_classifier(None)), feed=token_feed),
}
#: What --models means without it: the models above, the zoo's left out.
DEFAULT_MODELS = tuple(MODELS)
ZOO_PREFIX = "zoo:"


def _zoo_model(model) -> dict:
    """A zoo model (tests/zoo/models.py) as MODELS holds one: the zoo's export (its seeded weights; `size` unused)
    and its feeds at each batch."""
    return dict(export=lambda directory, size: zoo_export(model, directory),
                feed=lambda batch, rng, specs: make_feed(model, specs, int(rng.integers(2 ** 31)), batch))


MODELS.update({ZOO_PREFIX + name: _zoo_model(model) for name, model in ZOO_REQUIRED.items()})
#: Models also converted in INT8 (calibrated on random inputs), served against their FP32 engines.
INT8_MODELS = ("resnet50", "bert")


def digits_cnn(directory: str) -> dict:
    """A small CNN trained on scikit-learn's digits (8x8), exported; its test images and labels."""
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    digits = load_digits()
    images = (digits.images[..., None] / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.3, random_state=0)
    L = keras.layers
    model = keras.Sequential([keras.Input((8, 8, 1)), L.Conv2D(16, 3, padding="same", activation="relu"),
                              L.Conv2D(32, 3, padding="same", activation="relu"), L.MaxPooling2D(),
                              L.Flatten(), L.Dense(64, activation="relu"), L.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x_train, y_train, epochs=30, batch_size=32, verbose=0)
    model.export(directory, verbose=False)
    return {"x_train": x_train, "x_test": x_test, "y_test": y_test}


# -- conversion (this process) ----------------------------------------------------------------------------------
def signature_specs(directory: str) -> dict:
    import tensorflow as tf

    return dict(tf.saved_model.load(directory).signatures["serving_default"].structured_input_signature[1])


def convert(native_dir: str, out_dir: str, feeds, precision="FP32", calibration=None, loops=False) -> float:
    """Convert (`loops`: compile_native_loops), build an engine per feed, save; returns the seconds it took."""
    from tftrt_py import trt_convert as trt

    start = time.perf_counter()
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=precision,
                                                        maximum_cached_engines=len(feeds) + 1)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir, conversion_params=params,
                                        compile_native_loops=loops)
    if calibration is not None:
        converter.convert(calibration_input_fn=lambda: iter(calibration))
    else:
        converter.convert()
    converter.build(input_fn=lambda: iter(feeds))
    converter.save(out_dir, overwrite=True)
    return time.perf_counter() - start


def native_run(directory: str, feed: dict, iters: int):
    """(TF's outputs, median ms) of the SavedModel's serving signature on `feed`."""
    import tensorflow as tf

    signature = tf.saved_model.load(directory).signatures["serving_default"]
    tensors = {k: tf.constant(v) for k, v in feed.items()}
    outputs = {k: v.numpy() for k, v in signature(**tensors).items()}
    return outputs, timed(lambda: signature(**tensors), min_iters=iters, warmup=1)


def prepare(args, work: str) -> dict:
    """Export, time native TF and convert every model; the job the serving processes run, with TF's results."""
    rng = np.random.default_rng(0)
    job = {"entries": [], "tf": {}, "convert_s": {}}
    for name in args.models:
        model = MODELS[name]
        native = os.path.join(work, name, "native")
        model["export"](native, args.size)
        specs = signature_specs(native)
        feeds = {b: model["feed"](b, rng, specs) for b in args.batches}
        precisions = ["FP32"] + (["INT8"] if name in INT8_MODELS and args.int8 else [])
        for precision in precisions:
            # calibrated at the smallest batch: an engine built for a larger one would serve it (padded)
            calibration = [model["feed"](min(args.batches), rng, specs)
                           for _ in range(max(2, 16 // min(args.batches)))] if precision == "INT8" else None
            out = os.path.join(work, name, precision.lower())
            job["convert_s"][f"{name}/{precision}"] = convert(native, out, list(feeds.values()), precision,
                                                              calibration, args.compile_native_loops)
            for b, feed in feeds.items():
                arrays = os.path.join(work, name, f"batch{b}.npz")
                if precision == "FP32":
                    want, ms = native_run(native, feed, args.iters)
                    job["tf"][f"{name}/{b}"] = ms
                    np.savez(arrays, **{f"in/{k}": v for k, v in feed.items()},
                             **{f"out/{k}": v for k, v in want.items()})
                    print(f"[tf] {name} batch {b}: {ms:.2f} ms", flush=True)
                job["entries"].append({"model": name, "precision": precision, "batch": b, "dir": out,
                                       "native": native, "arrays": arrays})
    if args.int8:
        native = os.path.join(work, "digits", "native")
        data = digits_cnn(native)
        np.savez(os.path.join(work, "digits", "test.npz"), x=data["x_test"], y=data["y_test"])
        tf_logits, _ = native_run(native, {next(iter(signature_specs(native))): data["x_test"]}, 1)
        job["digits_tf"] = float(np.mean(next(iter(tf_logits.values())).argmax(-1) == data["y_test"]))
        n = len(data["x_test"])
        name = next(iter(signature_specs(native)))
        calibration = [{name: data["x_train"][i:i + n]} for i in range(0, len(data["x_train"]), n)]
        for precision in ("FP32", "INT8"):
            out = os.path.join(work, "digits", precision.lower())
            convert(native, out, [{name: data["x_test"]}], precision,
                    calibration if precision == "INT8" else None)
            job["entries"].append({"model": "digits", "precision": precision, "dir": out,
                                   "arrays": os.path.join(work, "digits", "test.npz")})
    return job


# -- serving (a fresh process per backend) ---------------------------------------------------------------------
def serve(job_path: str, backend: str, model: str, iters: int) -> dict:
    """Load `model`'s converted SavedModels on `backend` (TFTRT_PY_BACKEND, set by the caller) and time them."""
    import tensorflow as tf

    from tftrt_py import trt_convert as trt

    job, results = json.load(open(job_path)), []
    loaded = {}

    def load(directory):
        if directory not in loaded:
            loaded[directory] = tf.saved_model.load(directory).signatures["serving_default"]
        return loaded[directory]

    for entry in job["entries"]:
        if entry["model"] != model or entry["precision"] == "INT8" and backend == "numpy":
            continue  # the numpy backend emulates INT8 (a reference, not a serving path)
        signature, arrays = load(entry["dir"]), np.load(entry["arrays"])
        before = sum(s["fallback_total"] for s in trt.engine_op_stats().values())
        result = dict(entry, backend=backend)
        if entry["model"] == "digits":
            (name, _), = signature.structured_input_signature[1].items()
            logits = next(iter(signature(**{name: tf.constant(arrays["x"])}).values())).numpy()
            result["accuracy"] = float(np.mean(logits.argmax(-1) == arrays["y"]))
        else:
            feed = {k[3:]: tf.constant(arrays[k]) for k in arrays.files if k.startswith("in/")}
            got = signature(**feed)
            outs = [k for k in arrays.files if k.startswith("out/")]
            result["max_error"] = max(float(np.max(np.abs(got[k[4:]].numpy() - arrays[k]))) for k in outs)
            result["max_relative_error"] = result["max_error"] / max(float(np.max(np.abs(arrays[k]))) for k in outs)
            native = load(entry["native"])
            # TF before and after the converted model, in this process: the machine's load changes over a run
            before_ms = timed(lambda: native(**feed), min_iters=iters, warmup=1)
            result["ms"] = timed(lambda: signature(**feed), min_iters=iters, warmup=1)
            result["tf_ms"] = (before_ms + timed(lambda: native(**feed), min_iters=iters, warmup=0)) / 2
        result["fallbacks"] = sum(s["fallback_total"] for s in trt.engine_op_stats().values()) - before
        print(f"[{backend}] {entry['model']} {entry['precision']} batch {entry.get('batch', '-')}: "
              + ", ".join(f"{k} {result[k]:.4g}" for k in ("tf_ms", "ms", "max_error", "accuracy") if k in result)
              + (f", {result['fallbacks']} native fallbacks" if result["fallbacks"] else ""), flush=True)
        results.append(result)
    return {"results": results}


def serve_in_fresh_process(job: dict, job_path: str, backend: str, iters: int, work: str) -> list:
    """serve() each model in a fresh process (one backend per process; memory given back between models)."""
    results = []
    for model in dict.fromkeys(e["model"] for e in job["entries"]):
        out = os.path.join(work, f"served_{backend}_{model}.json")
        command = [sys.executable, os.path.abspath(__file__), "--serve", backend, "--job", job_path,
                   "--serve-model", model, "--out", out, "--iters", str(iters)]
        if subprocess.run(command, env=dict(os.environ, TFTRT_PY_BACKEND=backend)).returncode:
            print(f"[{backend}] serving {model} failed (see above)")
            continue
        results += json.load(open(out))["results"]
    return results


def available_backends(wanted=BACKENDS) -> list:
    names = []
    for name in wanted:
        try:
            from tftrt_py.engine.backends import get_backend

            get_backend(name)
            if name == "onnxruntime":
                import onnxruntime  # noqa: F401
            names.append(name)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run here is left out, said why
            print(f"[{name}] not measured: {exc}")
    return names


# -- OpenVINO vs ONNX Runtime on the same ONNX model ----------------------------------------------------------
def largest_engine(saved_dir: str, batch: int):
    """The engine with the most layers among those a converted SavedModel saved for `batch`, and how many engines
    it saved for that batch."""
    from tftrt_py.engine import Runtime
    from tftrt_py.engine_op.cache import unpack_plans

    engines = [Runtime(backend="numpy").deserialize_cuda_engine(plan)
               for path in glob.glob(os.path.join(saved_dir, "assets", "trt-serialized-engine.*"))
               for plan in unpack_plans(open(path, "rb").read())]
    engines = [e for e in engines if e.inputs and e.inputs[0].shape[:1] == (batch,)] or engines
    return max(engines, key=lambda e: len(e.network.layers)), len(engines)


def runtime_side_by_side(job: dict, iters: int) -> list:
    import openvino as ov

    from tftrt_py.engine.backends import get_backend
    from tftrt_py.engine.backends.onnxruntime.lowering import lower
    from tftrt_py.engine.backends.threads import cpu_threads

    threads, rows = cpu_threads(), []
    for entry in job["entries"]:
        if entry["model"] not in ("resnet50", "bert") or entry["precision"] != "FP32":
            continue
        row = {"model": entry["model"], "batch": entry["batch"], "threads": threads}
        try:
            row.update(_side_by_side(entry, ov, get_backend("onnxruntime"), lower, threads, iters))
        except Exception as exc:  # noqa: BLE001 - a measurement: the error is the result
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        print(f"[onnx] {row}", flush=True)
        rows.append(row)
    return rows


def _side_by_side(entry: dict, ov, backend, lower, threads: int, iters: int) -> dict:
    engine, count = largest_engine(entry["dir"], entry["batch"])
    rng = np.random.default_rng(1)
    feed = {t.name: (rng.uniform(-1, 1, t.shape) if np.dtype(t.dtype).kind == "f" else
                     rng.integers(0, 2, t.shape)).astype(t.dtype) for t in engine.inputs}
    reference = list(engine.create_execution_context().execute(feed).values())  # the numpy backend
    proto = lower(engine.network)
    session = backend.session(proto)  # as the backend serves it
    names = [i.name for i in session.get_inputs()]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        open(path, "wb").write(proto.SerializeToString())
        compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                         "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    ort_feed, ov_feed = {n: feed[n] for n in names}, [feed[n] for n in names]
    row = {"layers": len(engine.network.layers), "engines": count}
    runs = {"onnxruntime": (lambda: session.run(None, ort_feed), lambda out: out),
            "openvino": (lambda: request.infer(ov_feed), lambda out: [out[o] for o in compiled.outputs])}
    for name, (fn, outputs) in runs.items():
        got = outputs(fn())
        row[f"{name}_max_error"] = max(float(np.max(np.abs(np.asarray(g, np.float64) - r)))
                                       for g, r in zip(got, reference))
        row[f"{name}_ms"] = timed(fn, min_iters=iters)
    return row


# -- report -----------------------------------------------------------------------------------------------------
def tables(job: dict, served: list, side: list) -> str:
    backends = sorted({r["backend"] for r in served}, key=BACKENDS.index)
    by = {(r["model"], r["precision"], r.get("batch"), r["backend"]): r for r in served}
    width = max([13] + [len(e["model"]) + 6 for e in job["entries"]])  # room for " INT8"
    lines = [f"{'model':{width}s}batch  " + "  ".join(f"   TF ms {b:>11s} ms  speed-up  rel err" for b in backends)]
    fallbacks = False
    for entry in job["entries"]:
        if entry["model"] == "digits":
            continue
        key = (entry["model"], entry["precision"], entry["batch"])
        cells = []
        for b in backends:
            r = by.get(key + (b,))
            mark = "!" if r and r["fallbacks"] else " "
            fallbacks |= mark == "!"
            cells.append(f"{r['tf_ms']:8.2f}{r['ms']:14.2f}{mark}  {r['tf_ms'] / r['ms']:7.2f}x  "
                         f"{r['max_relative_error']:7.1e}" if r else f"{'-':>8s}{'-':>15s}  {'-':>8s}  {'-':>7s}")
        label = entry["model"] + ("" if entry["precision"] == "FP32" else f" {entry['precision']}")
        lines.append(f"{label:{width}s}{entry['batch']:5d}  " + "  ".join(cells))
    if fallbacks:
        lines.append("! engines failed and native segments ran (see the log above): not a measurement of engines")
    lines.append("TF ms: native TF in the same process, before and after the converted model (mean of the two "
                 "medians); rel err: largest |converted - TF| over the largest |TF output|")
    for b in backends:
        for model in INT8_MODELS:
            int8 = [(by.get((model, "INT8", n, b)), by.get((model, "FP32", n, b))) for n in job["batches"]]
            ratios = [f"batch {q['batch']}: {f['ms'] / q['ms']:.2f}x"
                      + (" (native fallbacks!)" if q["fallbacks"] else "") for q, f in int8 if q and f]
            if ratios:
                lines.append(f"{model} INT8 vs FP32 on {b}: " + ", ".join(ratios))
        digits = {p: by.get(("digits", p, None, b)) for p in ("FP32", "INT8")}
        if all(digits.values()):
            lines.append(f"digits CNN accuracy on {b}: TF {job['digits_tf']:.4f}, "
                         f"FP32 {digits['FP32']['accuracy']:.4f}, INT8 {digits['INT8']['accuracy']:.4f}"
                         + (" (native fallbacks!)" if any(d["fallbacks"] for d in digits.values()) else ""))
    if side:
        lines.append("same ONNX model (largest engine)  batch  layers  threads  onnxruntime ms  openvino ms  "
                     "ORT/OV  ORT err  OV err")
        for r in side:
            if "error" in r:
                lines.append(f"{r['model']:34s}{r['batch']:6d}  {r['error'][:110]}")
                continue
            lines.append(f"{r['model']:34s}{r['batch']:6d}{r['layers']:8d}{r['threads']:9d}{r['onnxruntime_ms']:16.2f}"
                         f"{r['openvino_ms']:13.2f}{r['onnxruntime_ms'] / r['openvino_ms']:8.2f}"
                         f"{r['onnxruntime_max_error']:9.1e}{r['openvino_max_error']:8.1e}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help=f"comma-separated, of {', '.join(MODELS)}; zoo: every {ZOO_PREFIX}NAME")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--size", type=int, default=224,
                        help="image models' input size (the CNN keeps 32, the zoo's models their own)")
    parser.add_argument("--iters", type=int, default=5, help="fewest timed calls per measurement")
    parser.add_argument("--no-int8", dest="int8", action="store_false", help="skip the INT8 and digits parts")
    parser.add_argument("--no-openvino", dest="openvino", action="store_false")
    parser.add_argument("--compile-native-loops", action="store_true",
                        help="convert with compile_native_loops: loops left native are compiled by XLA")
    parser.add_argument("--workdir", default=os.path.join(ROOT, "out", "cpu_vs_tf"))
    parser.add_argument("--json")
    parser.add_argument("--serve", choices=BACKENDS, help=argparse.SUPPRESS)  # a serving process (see serve)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--serve-model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        json.dump(serve(args.job, args.serve, args.serve_model, args.iters), open(args.out, "w"))
        return 0
    args.models = list(dict.fromkeys(name for m in args.models.split(",") if m for name in (
        [n for n in MODELS if n.startswith(ZOO_PREFIX)] if m == "zoo" else [m])))
    args.batches = [int(b) for b in args.batches.split(",")]
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.models) - set(MODELS) | set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown models or backends {sorted(unknown)}")
    os.environ["TFTRT_PY_BACKEND"] = "numpy"  # builds here only plan engines; serving processes pick theirs
    os.makedirs(args.workdir, exist_ok=True)
    job = prepare(args, args.workdir)
    job["batches"] = args.batches
    job_path = os.path.join(args.workdir, "job.json")
    json.dump(job, open(job_path, "w"))
    served = [r for b in available_backends(args.backends)
              for r in serve_in_fresh_process(job, job_path, b, args.iters, args.workdir)]
    side = []
    if args.openvino:
        try:
            side = runtime_side_by_side(job, args.iters)
        except ImportError as exc:
            print(f"[onnx] OpenVINO vs ONNX Runtime not measured: {exc}")
    print(tables(job, served, side))
    if args.json:
        json.dump({"job": job, "served": served, "onnx_runtimes": side}, open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
