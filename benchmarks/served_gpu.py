"""What users get on a GPU: converted SavedModels served through ``tf.saved_model.load``, against the same
engine called directly and against PyTorch, on one GPU machine in one run.

Models (random weights, nothing downloaded): Keras ResNet50, a keras-hub BERT-base encoder (sequence 128, token
ids + segment ids + padding mask with padded tails), a keras-hub GPT-2 small (causal, padding mask) and a keras-hub
ViT-B/16 (224x224, 197 tokens, erf GELU; PyTorch's ViTModel has random weights of its own: timing only), each in
FP16 and INT8 (``--precisions``: also FP32, FP8). Each is exported, converted (engines built for every batch; the
build of the first three batches is timed), saved, loaded and checked against native TF (``err``); BERT and GPT-2
also against HF ``transformers`` models holding the same weights, run in fp32 (``vs_torch32``). Per batch it
times, in milliseconds (median of single calls, wall clock):

- ``tf``: native TensorFlow (the CPU build: this machine's TF has no GPU kernels);
- ``signature``: the converted model's serving signature, host inputs in, host outputs out (what users call);
- ``floor``: the least a signature call can take on this machine: ``engine_device``, the inputs' and outputs'
  bytes across PCIe at the pinned rates measured at the start, ``tf_call`` and TensorFlow's own ``.numpy()`` of
  tensors of the outputs' shapes (``sig/floor``: how far the signature is from it);
- ``signature_view``: the same call with its outputs read as ``np.asarray(tensor)`` (a view of TensorFlow's
  buffer; ``.numpy()`` copies it, as TensorFlow documents), ``cmp/view`` = compile_host / signature_view;
- ``engine_host``: the engine op's engine on the same host arrays (its context pool, no TensorFlow);
- ``engine_device``: the engine on arrays already on the GPU;
- then each batch's engines of all precisions timed against each other in ``--rounds`` interleaved rounds
  (benchmarks/interleaved.py: back-to-back GPU microseconds a call; speed-up over FP16, the median of the
  per-round ratios);
- ``torch_host`` / ``torch_device``, ``compile_host`` / ``compile_device``: the same architecture in PyTorch
  (fp16, eager and torch.compile reduce-overhead), its input on the host (copied in, output copied out) or on
  the GPU; ``cmp/dev`` = compile_device / engine_device and ``cmp/sig`` = compile_host / signature (> 1: ours is
  faster).

Then 1, 4 and 8 threads call the signature at one batch: aggregate calls/s, p50 and p99 latency. ``--trace``
prints each call step by step against each step's floor (copy in, device, hand-off, TensorFlow, ``.numpy()``).

    python benchmarks/served_gpu.py --models resnet50 --json $OUT/served.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "models")]

import interleaved  # noqa: E402 - after the path is set
from tftrt_py.engine.replay import mean_times  # noqa: E402

SEQ = 128


def timed(fn, min_seconds: float = 0.4, min_iters: int = 5, max_iters: int = 300, warmup: int = 3) -> float:
    """Median wall-clock milliseconds of `fn()` (which must finish its work before returning)."""
    for _ in range(warmup):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() - start < min_seconds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def concurrent(fn, threads: int, calls: int, answers=None) -> dict:
    """`threads` threads, thread i calling `fn(i)` `calls` times: aggregate calls/s, latency percentiles (ms) and
    how many calls answered other than ``answers[i]`` (the single caller's outputs for thread i's inputs)."""
    lat: list = []
    wrong = []
    lock = threading.Lock()

    def worker(i):
        mine, bad = [], 0
        for _ in range(calls):
            t0 = time.perf_counter()
            out = fn(i)
            mine.append((time.perf_counter() - t0) * 1e3)
            if answers is not None:
                bad += not all(np.array_equal(o, a) for o, a in zip(out, answers[i]))
        with lock:
            lat.extend(mine)
            wrong.append(bad)
    warm = [threading.Thread(target=lambda i=i: [fn(i) for _ in range(5)]) for i in range(threads)]
    for t in warm:  # untimed: the callers' first calls make what they need (execution contexts, replays)
        t.start()
    for t in warm:
        t.join()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - t0
    return {"threads": threads, "calls_per_s": threads * calls / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "wrong_answers": sum(wrong)}


# -- models -----------------------------------------------------------------------------------------------------
def resnet50_keras(directory: str):
    """Keras ResNet50 with random weights and random batch-norm statistics, as a trained model has them. With the
    default statistics (an identity no trained model has), 18 instead of 4 of its cuDNN convolution graphs per
    batch size had only runtime-compiled plans (H100: three FP16 shapes built in 27 s instead of 16 s)."""
    from sample_models import build_keras_application

    model = build_keras_application("resnet50", size=224)[0]
    model.export(directory, verbose=False)
    return model


def _keras_hub_base(directory: str, backbone: str, vocabulary_size: int, max_sequence_length: int):
    """A 12-layer, 768-wide keras-hub backbone with random weights, exported to `directory`."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    model = getattr(keras_hub.models, backbone)(
        vocabulary_size=vocabulary_size, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072,
        dropout=0.0, max_sequence_length=max_sequence_length)
    model.export(directory, verbose=False)
    return model


def bert_keras(directory: str):
    return _keras_hub_base(directory, "BertBackbone", 30522, 512)


def gpt2_keras(directory: str):
    return _keras_hub_base(directory, "GPT2Backbone", 50257, 1024)


def vit_keras(directory: str):
    """keras-hub ViT-B/16 at 224x224 (197 tokens, erf GELU), random weights, exported to `directory`."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    model = keras_hub.models.ViTBackbone(image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=12,
                                         hidden_dim=768, mlp_dim=3072)
    model.export(directory, verbose=False)
    return model


def vit_feed(batch: int, rng) -> dict:
    return {"images": rng.uniform(-1, 1, (batch, 224, 224, 3)).astype(np.float32)}


def resnet50_feed(batch: int, rng) -> dict:
    return {"inputs": rng.uniform(-1, 1, (batch, 224, 224, 3)).astype(np.float32)}


def _padding_mask(batch: int, rng):
    lengths = rng.integers(SEQ // 2, SEQ + 1, batch)
    return lengths, (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)


def bert_feed(batch: int, rng) -> dict:
    lengths, mask = _padding_mask(batch, rng)
    return {"token_ids": (rng.integers(1, 30522, (batch, SEQ)) * mask).astype(np.int32),
            "segment_ids": (np.arange(SEQ)[None, :] >= lengths[:, None] // 2).astype(np.int32) * mask,
            "padding_mask": mask}


def gpt2_feed(batch: int, rng) -> dict:
    _, mask = _padding_mask(batch, rng)
    return {"token_ids": (rng.integers(1, 50257, (batch, SEQ)) * mask).astype(np.int32), "padding_mask": mask}


def resnet50_torch(torch, source):
    """torchvision's ResNet-50 (random weights: timing only, its outputs are not compared)."""
    import torchvision

    model = torchvision.models.resnet50().cuda().half().eval().to(memory_format=torch.channels_last)

    def prepare(feed, device):
        x = torch.from_numpy(np.ascontiguousarray(next(iter(feed.values())).transpose(0, 3, 1, 2)))
        return (x.cuda().half().to(memory_format=torch.channels_last),) if device else (x,)

    def host_call(model_):
        def call(x):
            y = model_(x.cuda(non_blocking=False).half().to(memory_format=torch.channels_last))
            return y.float().cpu()
        return call
    return model, prepare, host_call, None


def vit_torch(torch, source):
    """HF `transformers` ViTModel, ViT-B/16 at 224 without its pooler (random weights: timing only, its outputs are
    not compared)."""
    import transformers

    config = transformers.ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                    intermediate_size=3072, image_size=224, patch_size=16, layer_norm_eps=1e-6,
                                    attn_implementation="sdpa")
    model = transformers.ViTModel(config, add_pooling_layer=False).eval()

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return (self.m(pixel_values=x).last_hidden_state,)

    def prepare(feed, device):
        x = torch.from_numpy(np.ascontiguousarray(feed["images"].transpose(0, 3, 1, 2)))
        return (x.cuda().half(),) if device else (x,)

    def host_call(model_):
        def call(x):
            return model_(x.cuda().half())[0].float().cpu()
        return call
    return Positional().cuda().half(), prepare, host_call, None


def _weights(source) -> dict:
    """The Keras model's weights by path, as numpy arrays."""
    return {w.path: np.asarray(w.numpy()) for w in source.weights}


def _copy(torch, module, array, transpose: bool = False):
    a = array.reshape(module.shape[::-1] if transpose else module.shape)
    module.data.copy_(torch.from_numpy(np.ascontiguousarray(a.T if transpose else a)))


def bert_torch(torch, source):
    """HF `transformers` BertModel with the Keras model's weights (keras-hub's BERT: post-norm, tanh GELU)."""
    import transformers

    config = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                     intermediate_size=3072, hidden_act="gelu_new", layer_norm_eps=1e-12,
                                     max_position_embeddings=512, type_vocab_size=2, attn_implementation="sdpa")
    model = transformers.BertModel(config).eval()
    w = _weights(source)
    e = model.embeddings
    with torch.no_grad():
        _copy(torch, e.word_embeddings.weight, w["token_embedding/embeddings"])
        _copy(torch, e.position_embeddings.weight, w["position_embedding/embeddings"])
        _copy(torch, e.token_type_embeddings.weight, w["segment_embedding/embeddings"])
        _copy(torch, e.LayerNorm.weight, w["embeddings_layer_norm/gamma"])
        _copy(torch, e.LayerNorm.bias, w["embeddings_layer_norm/beta"])
        for i, layer in enumerate(model.encoder.layer):
            p = f"transformer_layer_{i}/"
            att = layer.attention
            for name in ("query", "key", "value"):
                _copy(torch, getattr(att.self, name).weight, w[f"{p}self_attention_layer/{name}/kernel"], True)
                _copy(torch, getattr(att.self, name).bias, w[f"{p}self_attention_layer/{name}/bias"])
            _copy(torch, att.output.dense.weight, w[f"{p}self_attention_layer/attention_output/kernel"], True)
            _copy(torch, att.output.dense.bias, w[f"{p}self_attention_layer/attention_output/bias"])
            _copy(torch, att.output.LayerNorm.weight, w[f"{p}self_attention_layer_norm/gamma"])
            _copy(torch, att.output.LayerNorm.bias, w[f"{p}self_attention_layer_norm/beta"])
            _copy(torch, layer.intermediate.dense.weight, w[f"{p}feedforward_intermediate_dense/kernel"], True)
            _copy(torch, layer.intermediate.dense.bias, w[f"{p}feedforward_intermediate_dense/bias"])
            _copy(torch, layer.output.dense.weight, w[f"{p}feedforward_output_dense/kernel"], True)
            _copy(torch, layer.output.dense.bias, w[f"{p}feedforward_output_dense/bias"])
            _copy(torch, layer.output.LayerNorm.weight, w[f"{p}feedforward_layer_norm/gamma"])
            _copy(torch, layer.output.LayerNorm.bias, w[f"{p}feedforward_layer_norm/beta"])
        _copy(torch, model.pooler.dense.weight, w["pooled_dense/kernel"], True)
        _copy(torch, model.pooler.dense.bias, w["pooled_dense/bias"])

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, seg, mask):
            y = self.m(input_ids=ids, token_type_ids=seg, attention_mask=mask)
            return y.last_hidden_state, y.pooler_output

    def prepare(feed, device):
        args = tuple(torch.from_numpy(feed[k]).long() for k in ("token_ids", "segment_ids", "padding_mask"))
        return tuple(a.cuda() for a in args) if device else args
    return Positional().cuda().half(), prepare, _host_call, ("sequence_output", "pooled_output")


def gpt2_torch(torch, source):
    """HF `transformers` GPT2Model with the Keras model's weights (causal, padding mask, tanh GELU)."""
    import transformers

    config = transformers.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                                     n_inner=3072, activation_function="gelu_new", layer_norm_epsilon=1e-5,
                                     attn_implementation="sdpa")
    model = transformers.GPT2Model(config).eval()
    w = _weights(source)
    with torch.no_grad():
        _copy(torch, model.wte.weight, w["token_embedding/embeddings"])
        _copy(torch, model.wpe.weight, w["position_embedding/embeddings"])
        for i, block in enumerate(model.h):
            p = f"transformer_layer_{i}/"
            qkv = [w[f"{p}self_attention/{n}/kernel"].reshape(768, 768) for n in ("query", "key", "value")]
            _copy(torch, block.attn.c_attn.weight, np.concatenate(qkv, axis=1))  # Conv1D: [in, out]
            _copy(torch, block.attn.c_attn.bias, np.concatenate(
                [w[f"{p}self_attention/{n}/bias"].reshape(-1) for n in ("query", "key", "value")]))
            _copy(torch, block.attn.c_proj.weight, w[f"{p}self_attention/attention_output/kernel"])
            _copy(torch, block.attn.c_proj.bias, w[f"{p}self_attention/attention_output/bias"])
            _copy(torch, block.ln_1.weight, w[f"{p}self_attention_layer_norm/gamma"])
            _copy(torch, block.ln_1.bias, w[f"{p}self_attention_layer_norm/beta"])
            _copy(torch, block.mlp.c_fc.weight, w[f"{p}feedforward_intermediate_dense/kernel"])
            _copy(torch, block.mlp.c_fc.bias, w[f"{p}feedforward_intermediate_dense/bias"])
            _copy(torch, block.mlp.c_proj.weight, w[f"{p}feedforward_output_dense/kernel"])
            _copy(torch, block.mlp.c_proj.bias, w[f"{p}feedforward_output_dense/bias"])
            _copy(torch, block.ln_2.weight, w[f"{p}feedforward_layer_norm/gamma"])
            _copy(torch, block.ln_2.bias, w[f"{p}feedforward_layer_norm/beta"])
        _copy(torch, model.ln_f.weight, w["layer_norm/gamma"])
        _copy(torch, model.ln_f.bias, w["layer_norm/beta"])

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids, mask, pos):
            return (self.m(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state,)

    def prepare(feed, device):
        args = tuple(torch.from_numpy(feed[k]).long() for k in ("token_ids", "padding_mask"))
        args += (torch.arange(SEQ).expand(args[0].shape).contiguous(),)  # keras-hub: positions from 0 in every row
        return tuple(a.cuda() for a in args) if device else args
    return Positional().cuda().half(), prepare, _host_call, ("sequence_output",)


def _host_call(model_):
    """`model_` called on host tensors: copied in, its first output copied out."""
    def call(*args):
        return model_(*(a.cuda() for a in args))[0].float().cpu()
    return call


def torch_fp32(torch, model, prepare, outputs, feed) -> dict:
    """The PyTorch model's outputs (named `outputs`) in fp32 (no TF32) for `feed`, as float64 numpy arrays."""
    matmul_tf32, cudnn_tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.inference_mode():
            y = model.float()(*prepare(feed, True))
            return {k: v.double().cpu().numpy() for k, v in zip(outputs, y)}
    finally:
        model.half()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32


def rel_err(got: dict, want: dict) -> float:
    """Largest |got - want| over the outputs both have (a single output each: those two), relative past a
    magnitude of 1."""
    if len(got) == len(want) == 1:
        got, want = {0: next(iter(got.values()))}, {0: next(iter(want.values()))}
    return max(float(np.max(np.abs(np.asarray(got[k], np.float64) - want[k]))
                     / max(1.0, float(np.max(np.abs(want[k])))))
               for k in want if k in got)


MODELS = {
    "resnet50": dict(export=resnet50_keras, feed=resnet50_feed, torch=resnet50_torch),
    "bert": dict(export=bert_keras, feed=bert_feed, torch=bert_torch),
    "gpt2": dict(export=gpt2_keras, feed=gpt2_feed, torch=gpt2_torch),
    "vit": dict(export=vit_keras, feed=vit_feed, torch=vit_torch),
}


# -- conversion -------------------------------------------------------------------------------------------------
def convert(feed, source: str, precision: str, batches, rng, out_dir: str, profile_build: bool = False) -> dict:
    """Convert, build for `batches` (the first three timed together; `feed(batch, rng)` gives an input dict),
    save and load; the loaded signature and the times."""
    import tensorflow as tf

    from tftrt_py import trt_convert as trt

    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=precision,
                                                        maximum_cached_engines=len(batches) + 1)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=source, conversion_params=params)
    t0 = time.perf_counter()
    if precision in ("INT8", "FP8"):  # calibrated at the smallest batch: an engine serves smaller batches than its own
        # (TF-TRT's implicit batch), so calibrating at 8 left batch 1 to the batch-8 engine built then
        calib = min(batches)
        converter.convert(calibration_input_fn=lambda: iter([feed(calib, rng) for _ in range(max(2, 16 // calib))]))
    else:
        converter.convert()
    convert_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if profile_build:  # the engine op's runs (builds, first runs) happen on TF's threads: profile them there
        import cProfile
        import pstats

        from tftrt_py.engine_op import dispatcher

        profiler, real = cProfile.Profile(), dispatcher.EngineOp.run
        dispatcher.EngineOp.run = lambda self, *a, **k: profiler.runcall(real, self, *a, **k)
        try:
            converter.build(input_fn=lambda: iter([feed(b, rng) for b in batches[:3]]))
        finally:
            dispatcher.EngineOp.run = real
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(45)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    else:
        converter.build(input_fn=lambda: iter([feed(b, rng) for b in batches[:3]]))
    build3_s = time.perf_counter() - t0
    converter.save(out_dir, overwrite=True)
    loaded = tf.saved_model.load(out_dir)
    signature = loaded.signatures["serving_default"]
    t0 = time.perf_counter()
    for b in batches[3:]:  # built on their first call (allow_build_at_runtime)
        signature(**{k: tf.constant(v) for k, v in feed(b, rng).items()})
    build_rest_s = time.perf_counter() - t0
    return {"signature": signature, "loaded": loaded, "convert_s": convert_s,
            "build3_s": build3_s, "build_rest_s": build_rest_s}


def trivial_signature(native, directory: str):
    """A loaded SavedModel signature with `native`'s inputs that only sums them: TensorFlow's own cost of
    calling a signature (argument handling, function call, outputs) with these inputs."""
    import tensorflow as tf

    specs = native.structured_input_signature[1]
    names = list(specs)

    @tf.function(input_signature=[tf.TensorSpec(specs[k].shape, specs[k].dtype, name=k) for k in names])
    def serve(*args):
        return {"output_0": tf.add_n([tf.reduce_sum(tf.cast(a, tf.float32)) for a in args])}

    module = tf.Module()
    module.serve = serve
    tf.saved_model.save(module, directory, signatures={"serving_default": serve.get_concrete_function()})
    return tf.saved_model.load(directory).signatures["serving_default"]


def copy_ceilings(cupy, nbytes: int) -> dict:
    """GB/s of the steps a host input takes: pageable -> pinned (1, 4, 8 threads), pinned -> device, and
    pageable -> device directly; and of an output's device -> pinned."""
    from tftrt_py.engine.backends.cupy import staging

    src = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(src.nbytes), np.float32, src.size)
    dev = cupy.empty(src.size, np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = {}
    for threads in (1, 4, 8):
        staging._pool = None
        os.environ[staging.THREADS_ENV] = str(threads)
        out[f"host_to_pinned_{threads}t"] = nbytes / timed(lambda: staging.copy(pinned, src)) / 1e6
    os.environ.pop(staging.THREADS_ENV)
    staging._pool = None

    def dma(a):
        dev.set(a, stream=stream)
        stream.synchronize()
    out["pinned_to_device"] = nbytes / timed(lambda: dma(pinned)) / 1e6

    def dma_back():
        dev.get(out=pinned, stream=stream)
        stream.synchronize()
    out["device_to_pinned"] = nbytes / timed(dma_back) / 1e6
    out["pageable_to_device"] = nbytes / timed(lambda: dma(src)) / 1e6
    out["staged_to_device"] = nbytes / timed(lambda: (staging.to_device(src, pinned, dev, stream),
                                                      stream.synchronize())) / 1e6
    return out


def floor_ms(row: dict, inputs: dict, outputs: dict, ceilings: dict) -> float:
    """The least a signature call can take here: the engine on device arrays, its inputs' and outputs' bytes across
    PCIe at the measured pinned rates, TensorFlow's call of a trivial signature, and TensorFlow's own ``.numpy()``
    of tensors of the outputs' shapes (a copy of its own). Each part goes in `row` (``floor_parts``) for the
    trace."""
    import tensorflow as tf

    nbytes = sum(v.nbytes for v in outputs.values())
    held = [tf.constant(v) for v in outputs.values()]
    numpy_ms = timed(lambda: [t.numpy() for t in held])
    bytes_in = sum(v.nbytes for v in inputs.values())
    row["floor_parts"] = {"copy_in": bytes_in / ceilings["pinned_to_device"] / 1e6,
                          "device": row["engine_device"] + nbytes / ceilings["device_to_pinned"] / 1e6,
                          "hand_off": 0.0, "tensorflow": row["tf_call"], "numpy": numpy_ms}
    return sum(row["floor_parts"].values())


def trace(row: dict) -> str:
    """One signature call step by step against each step's floor (floor_ms), milliseconds: the engine op's copy of
    the inputs to the device, the engine with its outputs' copy to the host, handing the outputs to TensorFlow
    (the op's own timers, mean per call), TensorFlow around the op (signature_view less the op) and ``.numpy()``
    (signature less signature_view)."""
    op = {k: v / 1e3 for k, v in row["native_us"].items()}
    steps = {"copy_in": op["copy_in"], "device": op["device"], "hand_off": op["copy_out"],
             "tensorflow": row["signature_view"] - op["kernel"], "numpy": row["signature"] - row["signature_view"]}
    floors = row["floor_parts"]
    return (f"trace {row['model']} {row['precision']} b{row['batch']}, ms (floor): " + ", ".join(
        f"{k} {v:.3f} ({floors[k]:.3f})" for k, v in steps.items())
        + f"; signature {row['signature']:.3f} ({row['floor']:.3f})")


def served_ops(created: set):
    """The engine ops alive of those one conversion created (its converter's and its loaded model's)."""
    from tftrt_py.engine_op import dispatcher

    return [op for key, op in dispatcher.engine_ops().items() if key in created]


def engine_callables(ops, feed_arrays: list, cupy):
    """{"host": host arrays in and out, "device": device arrays, then a sync, "enqueue": device arrays, no sync,
    "dispatch": the dispatcher's call, "profile": per-layer profile} of the engine serving these inputs in the one
    engine op of a whole-model conversion, or None when the model has several engine ops."""
    whole = [op for op in ops if op.stats.engine_runs]
    if len(whole) != 1:
        return None
    op = whole[0]
    arrays = feed_arrays
    order = _op_inputs(op, arrays)
    if order is None:
        return None
    shapes = tuple(tuple(a.shape) for a in order)
    found = op._context_for(shapes, allow_build=False)  # (cache key, context), None where no engine serves them
    if found is None:
        return None
    context = found[1]
    device = [cupy.asarray(a) for a in order]

    def host():
        context.execute_v2(order)

    def enqueue():
        context.execute_v2(device)

    def dev():
        enqueue()
        cupy.cuda.get_current_stream().synchronize()

    def dispatch():  # what the kernel calls, less TensorFlow
        op.run(order, [], True)

    def profile_engine(precision):
        from engine_profile import profile

        engine = context.engine
        profile(engine, engine.create_execution_context(), {t.name: a for t, a in zip(engine.inputs, device)},
                precision, top=20)
    return {"host": host, "device": dev, "enqueue": enqueue, "dispatch": dispatch, "profile": profile_engine}


def _op_inputs(op, arrays):
    """The feed arrays in the engine's binding order, matched by shape and dtype (None if ambiguous)."""
    engine = op.engines()[0]
    order = []
    pool = list(arrays)
    for t in engine.inputs:
        match = [a for a in pool if a.dtype.name == t.dtype and a.shape[1:] == tuple(t.shape[1:])]
        if not match:
            return None
        order.append(match[0])
        pool.remove(match[0])
    return order


def bench_model(name: str, args, torch, cupy, results: list, threads_rows: list, ceilings: dict) -> None:
    import tensorflow as tf

    from tftrt_py.engine_op import dispatcher

    spec = MODELS[name]
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix=f"served_{name}_")
    source = os.path.join(work, "source")
    keras_model = spec["export"](source)
    native = tf.saved_model.load(source).signatures["serving_default"]
    trivial = trivial_signature(native, os.path.join(work, "trivial"))
    batches = args.batches if name in ("resnet50", "vit") else args.transformer_batches
    names = list(native.structured_input_signature[1])

    def feed(batch, rng_):
        f = spec["feed"](batch, rng_)
        return {names[0]: next(iter(f.values()))} if len(names) == 1 else f  # Keras's "keras_tensor..." name
    feeds = {b: feed(b, np.random.default_rng(b)) for b in batches}
    # Converted and built before PyTorch runs in this process, as in a user's process (no torch there).
    convs = {}
    for precision in args.precisions:
        before = set(dispatcher.engine_ops())
        conv = convert(feed, source, precision, batches, rng, os.path.join(work, precision),
                       profile_build=args.profile_build and precision == args.precisions[0])
        conv["signature"](**{k: tf.constant(v) for k, v in feeds[batches[0]].items()})  # creates its engine ops
        convs[precision] = (set(dispatcher.engine_ops()) - before, conv)
    tf_ms = {b: timed(lambda b=b: native(**feeds[b]), min_seconds=0.2, min_iters=2, max_iters=20, warmup=1)
             for b in batches}
    model, prepare, host_call, outputs = spec["torch"](torch, keras_model)
    torch_ref = {b: torch_fp32(torch, model, prepare, outputs, feeds[b]) for b in batches} if outputs else {}
    compiled = torch.compile(model, mode="reduce-overhead") if args.compile else None  # CUDA graphs
    torch_ms = {}
    with torch.inference_mode():
        for b in batches if args.torch else ():
            row = {}
            for label, m in (("torch", model), ("compile", compiled)):
                if m is None or (label == "compile" and b not in args.compile_batches):
                    continue
                dev_args, host_args = prepare(feeds[b], True), prepare(feeds[b], False)
                call_host = host_call(m)
                row[f"{label}_device"] = timed(lambda: (m(*dev_args), torch.cuda.synchronize()))
                row[f"{label}_host"] = timed(lambda: call_host(*host_args))
            torch_ms[b] = row
    enqueued: dict = {}  # batch -> precision -> the engine on device arrays, no sync
    for precision, (created, conv) in convs.items():
        sig = conv["signature"]
        ops = None
        for b in batches:
            tensors = {k: tf.constant(v) for k, v in feeds[b].items()}
            got = {k: v.numpy() for k, v in sig(**tensors).items()}
            want = {k: v.numpy() for k, v in native(**tensors).items()}
            err = rel_err(got, want)
            ops = served_ops(created)
            states = {id(st): st.copy() for op in ops for st in op.stats.replay_states}
            row = {"model": name, "precision": precision, "batch": b, "max_rel_err": err, "tf": tf_ms[b],
                   "native_vs_torch32": (rel_err({k: v for k, v in want.items()}, torch_ref[b]) if b in torch_ref
                                         else None),
                   "vs_torch32": rel_err(got, torch_ref[b]) if b in torch_ref else None,
                   "signature": timed(lambda: [v.numpy() for v in sig(**tensors).values()]),
                   "signature_view": timed(lambda: [np.asarray(v) for v in sig(**tensors).values()]),
                   "native_us": mean_times([st - states.get(id(st), 0) for op in ops for st in op.stats.replay_states]),
                   "engine_ops": len(ops), "fallbacks": sum(sum(op.stats.fallbacks.values()) for op in ops)}
            calls = engine_callables(ops, list(feeds[b].values()), cupy)
            if calls is not None:
                row["engine_host"] = timed(calls["host"])
                row["engine_device"] = timed(calls["device"])
                row["dispatch"] = timed(calls["dispatch"])
                enqueued.setdefault(b, {})[precision] = calls["enqueue"]
                if args.profile_engine:
                    calls["profile"](f"{name} {precision} batch {b}")
            fresh = {k: tf.constant(v) for k, v in feed(b, np.random.default_rng(1000 + b)).items()}
            row["max_rel_err_fresh"] = rel_err({k: v.numpy() for k, v in sig(**fresh).items()},
                                               {k: v.numpy() for k, v in native(**fresh).items()})
            row["native_runs"] = sum(op.stats.native_runs for op in ops)
            row["tf_call"] = timed(lambda: [v.numpy() for v in trivial(**tensors).values()])
            if "engine_device" in row:
                row["floor"] = floor_ms(row, feeds[b], got, ceilings)
            row.update(torch_ms.get(b, {}))
            row.update(convert_s=conv["convert_s"], build3_s=conv["build3_s"], build_rest_s=conv["build_rest_s"])
            results.append(row)
            print(json.dumps(row), flush=True)
    for b, calls in enqueued.items():  # the precisions' engines timed against each other, taking turns (before
        if args.rounds > 0 and len(calls) > 1:  # the threaded runs: a run cut short by its time limit keeps them)
            found = interleaved.rounds(calls, args.rounds, "FP16")
            print(interleaved.report(f"{name} batch {b}", found, "FP16"), flush=True)
            for row in results:
                if row["model"] == name and row["batch"] == b and row["precision"] in found:
                    r = found[row["precision"]]
                    row.update(engine_gpu_us=r["gpu_us"], engine_gpu_rounds=r["rounds"],
                               engine_gpu_vs_fp16=r.get("vs_base"))
    b = args.thread_batch if args.thread_batch in batches else batches[0]
    thread_feeds = [{k: tf.constant(v) for k, v in feed(b, np.random.default_rng(500 + i)).items()}
                    for i in range(max(args.threads))]
    for precision, (_, conv) in convs.items():
        sig = conv["signature"]
        answers = [[v.numpy() for v in sig(**f).values()] for f in thread_feeds]
        for n in args.threads:
            r = concurrent(lambda i: [v.numpy() for v in sig(**thread_feeds[i]).values()], n, args.thread_calls,
                           answers)
            r.update(model=name, precision=precision, batch=b)
            threads_rows.append(r)
            print(json.dumps(r), flush=True)


def table(results, threads_rows) -> str:
    cols = ["tf", "signature", "floor", "signature_view", "engine_host", "engine_device", "torch_host", "torch_device",
            "compile_host", "compile_device", "tf_call", "dispatch"]
    lines = ["model     prec  batch " + " ".join(f"{c:>14}" for c in cols)
             + "   sig/host host/dev  cmp/dev cmp/sig sig/floor cmp/view  err (first / fresh)  vs_torch32  native runs"]

    def ratio(r, num, den):
        return f"{r[num] / r[den]:8.2f}" if r.get(num) and r.get(den) else "       -"
    for r in results:
        cells = " ".join(f"{r[c]:14.3f}" if c in r else f"{'-':>14}" for c in cols)
        ratios = " ".join(ratio(r, *pair) for pair in (("signature", "engine_host"), ("engine_host", "engine_device"),
                                                      ("compile_device", "engine_device"),
                                                      ("compile_host", "signature"), ("signature", "floor"),
                                                      ("compile_host", "signature_view")))
        vs = f"{r['vs_torch32']:.1e}" if r.get("vs_torch32") is not None else "-"
        lines.append(f"{r['model']:9} {r['precision']:5} {r['batch']:5} {cells} {ratios}  {r['max_rel_err']:.1e} / "
                     f"{r.get('max_rel_err_fresh', float('nan')):.1e}  {vs}  {r.get('native_runs', 0)}")
    lines.append("native replays, mean us per run (copy in / device / copy out / whole kernel): " + ", ".join(
        f"{r['model']} {r['precision']} b{r['batch']} " + "/".join(f"{v:.0f}" for v in r["native_us"].values())
        for r in results if r.get("native_runs")))
    gpu = [r for r in results if r.get("engine_gpu_us")]
    if gpu:
        lines.append("engine on device arrays, back-to-back GPU us a call (interleaved rounds; speed-up over FP16): "
                     + ", ".join(f"{r['model']} {r['precision']} b{r['batch']} {r['engine_gpu_us']:.0f}"
                                 + (f" ({r['engine_gpu_vs_fp16']:.3f}x)" if r.get("engine_gpu_vs_fp16") else "")
                                 for r in gpu))
    builds = {(r["model"], r["precision"]): (r["build3_s"], r["build_rest_s"]) for r in results}
    lines.append("builds (first three batches / the rest), s: " +
                 ", ".join(f"{m} {p} {a:.1f}/{b:.1f}" for (m, p), (a, b) in builds.items()))
    for r in threads_rows:
        lines.append(f"{r['model']} {r['precision']} batch {r['batch']}, {r['threads']} threads: "
                     f"{r['calls_per_s']:.1f} calls/s, p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
                     f"{r['wrong_answers']} answers differing from the single caller's")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet50", "bert"], choices=sorted(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--transformer-batches", "--bert-batches", nargs="+", type=int, default=[1, 8, 32, 128],
                        help="batches of the text transformer models (bert, gpt2); the image models take --batches")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--compile-batches", nargs="+", type=int, default=[1, 8, 32, 128])
    parser.add_argument("--torch", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--precisions", nargs="+", default=["FP16", "INT8"],
                        choices=["FP32", "FP16", "INT8", "FP8"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--thread-batch", type=int, default=8)
    parser.add_argument("--thread-calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds timing each batch's engines of "
                        "all precisions against each other, back to back on device arrays (0: none)")
    parser.add_argument("--profile-build", action="store_true", help="cProfile the first precision's build")
    parser.add_argument("--profile-engine", action="store_true",
                        help="per-layer GPU times of each whole-model engine at each batch")
    parser.add_argument("--trace", action="store_true", help="each signature call step by step against its floor")
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "served.json"))
    args = parser.parse_args()
    os.environ.setdefault("TFTRT_PY_BACKEND", "cupy")
    import cupy
    import torch

    torch.backends.cudnn.benchmark = True
    results, threads_rows = [], []
    ceilings = copy_ceilings(cupy, 32 * 224 * 224 * 3 * 4)  # a ResNet-50 batch of 32 (19 MB)
    print("copy GB/s, 19 MB: " + ", ".join(f"{k} {v:.1f}" for k, v in ceilings.items()), flush=True)
    for name in args.models:
        try:
            bench_model(name, args, torch, cupy, results, threads_rows, ceilings)
        except Exception:
            traceback.print_exc()
        with open(args.json, "w") as f:  # after each model: a run cut short keeps what it measured
            json.dump({"gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": results,
                       "threads": threads_rows, "copy_gb_s": ceilings}, f, indent=1)
    print("copy GB/s, 19 MB: " + ", ".join(f"{k} {v:.1f}" for k, v in ceilings.items()))
    print(table(results, threads_rows))
    if args.trace:
        print("\n".join(trace(r) for r in results if r.get("floor_parts") and r.get("native_runs")))
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
