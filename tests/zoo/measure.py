"""Where a zoo model stands: convert (FP32, FP16), build for its shapes, save, serve from a fresh process, compare.

Used by tests/zoo/test_zoo.py and benchmarks/zoo_report.py; tests/zoo/report.py formats the results. Each model
runs in three processes: a fresh one exports it and computes native TF's outputs (Keras keeps global state that a
failed build can poison), this one converts, builds and saves, and a fresh one loads the converted SavedModels and
serves fresh inputs: first at the batch built for, then at batch 1 (every input's dim 0 one, other dims unchanged),
which no engine was built for.

What is counted (``compute ops``): graph nodes other than the bookkeeping ops of BOOKKEEPING (placeholders,
constants, variable reads, identities, no-ops). Inside engines: the compute ops of the native segments of engine ops
that ran an engine when serving, and never their native segment. Outside: the compute ops of the converted graph
outside engine ops, plus those of the functions they call (loop bodies and conditions, branches).

Loops (While, StatelessWhile) whose trip count is known only when they run stay native by design, as in TF-TRT
(the others are unrolled: the LSTM's), and variant or resource tensors (TensorLists, variable handles) can never be
engine tensors. Native by design, and held to no target: loop nodes and the functions they call, nodes reading or
producing a variant or resource tensor (a variable the model writes as it serves: DeepLabV3's AssignVariableOps),
and shape computations left native as known when building (their copies serve in engines) whose every consumer is
native by design (a Shape -> StridedSlice -> Pack -> Fill sizing a TensorListReserve). Every other compute op must
serve in an engine.

Batch 1: an engine op serves it with its engine when that is row-wise (padded, or a copy re-batched: see
engine_op.buckets), else builds another engine when its ``_allow_build_at_runtime`` attribute allows (the
converter's default), else runs its native segment (correct, slower). Native TF is run at batch 1 on the same
inputs (never slices of the batched outputs: a BatchNormalization in training mode, as keras-hub's SegFormer and
DeepLabV3 heads call theirs, normalizes a lone sample with its own statistics); errors follow the rules and targets
of the built batch. Native segment runs at batch 1 are counted apart from the built batch's; those of engine ops
that build at run time or are row-wise are failures, the others are reported.

Errors: over every output, or, where a model names ``raw_outputs`` (the outputs a loop decodes, as NMS does),
FP32 and FP16 are held to those and FP32's decoded outputs to a relative 1e-5 of their scale. FP16 decoded
detections are not compared: NMS on FP16-rounded scores rightly keeps other boxes among near-ties.

FP32's max abs error is held to 1e-4, relative to the output's magnitude where that exceeds 1 (as numpy's rtol).
Models marked ``tf_kernels_reference``: TF's outputs are computed again with oneDNN's kernels and with Eigen's
(TF_ENABLE_ONEDNN_OPTS 1 and 0, fresh processes loading the same SavedModel: one of them is the host's default);
where they lie further than 1e-4 from the reference (EfficientNetV2B0 with random weights: up to 1.3e-4 on an
AVX-512 host), FP32 is held to twice that spread instead.
Models marked ``keras_fp16_reference`` (zoo.models): Keras's own fp16 error (the mixed_float16 policy, same weights,
same inputs) is measured too and printed next to ours; where Keras itself misses 1e-2 (EfficientNetV2B0 with random
weights: 6.3e-2), FP16 is held to twice Keras's error instead. MobileNetV3Small is one: with hard swish,
x * relu6(x + 3) / 6, run as four fp16 layers (four roundings) its FP16 error was 2.2e-2 of the logits' scale; with
hard swish and hard sigmoid recognized as one activation each (one rounding), 6.5e-3, Keras's 6.8e-3.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional

import numpy as np

__all__ = ["BOOKKEEPING", "PRECISIONS", "TARGETS", "BatchOneResult", "PrecisionResult", "ModelResult", "measure"]

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PRECISIONS = ("FP32", "FP16")
#: Ops that move or name values without computing: not counted on either side.
BOOKKEEPING = frozenset({"Placeholder", "Const", "NoOp", "Identity", "IdentityN", "Snapshot", "StopGradient",
                         "_Arg", "_Retval", "ReadVariableOp"})
#: The issue's targets: FP32 max abs error, FP16 max abs error over the output's max magnitude, FP32 decoded
#: outputs' max abs error over their max magnitude, share of compute ops serving in engines (in models with
#: loops: all of those not native by design).
TARGETS = {"FP32": 1e-4, "FP16": 1e-2, "decoded": 1e-5, "in_engines": 0.99, "in_engines_with_loops": 1.0}
ENGINE_OP = "TRTEngineOp"
LOOPS = frozenset({"While", "StatelessWhile"})
#: Tensors an engine can never hold.
OPAQUE = frozenset({"variant", "resource"})


def _error(precision: str, max_abs_error: Optional[float], rel_error: Optional[float]) -> Optional[float]:
    """The error a target applies to: FP32's max abs error, relative past an output magnitude of 1 (float32
    rounding scales with the values); FP16's relative to the output scale."""
    if max_abs_error is None:
        return None
    return min(max_abs_error, rel_error) if precision == "FP32" else rel_error


@dataclasses.dataclass
class BatchOneResult:
    """Serving batch-1 inputs with the model loaded (and served at the built batch) in the serving process."""
    serve_error: Optional[str] = None
    max_abs_error: Optional[float] = None  # as PrecisionResult's, against native TF run at batch 1
    rel_error: Optional[float] = None
    decoded_rel_error: Optional[float] = None
    rowwise: int = 0  # engine ops whose engine built for the built batch served batch 1 (padded, or a copy)
    copies: int = 0  # copies of row-wise engines made for batch 1 (see engine_op.buckets)
    builds: int = 0  # engines built at run time for batch 1
    build_failures: int = 0
    fallbacks: int = 0  # native segment runs at batch 1, all engine ops
    #: those of engine ops expected to serve batch 1: row-wise engines, or allowed to build at run time
    expected_fallbacks: int = 0
    native_runs: List[str] = dataclasses.field(default_factory=list)  # why engine ops ran their native segment


@dataclasses.dataclass
class PrecisionResult:
    precision: str
    convert_error: Optional[str] = None
    engines: int = 0  # engine ops in the converted graph
    serving_engines: int = 0  # engine ops that ran an engine (and never their native segment) when serving
    ops_in_engines: int = 0  # compute ops of the serving engine ops
    ops_total: int = 0  # compute ops of the whole graph (see the module docstring)
    loops: bool = False  # the graph has loops: its `by_design` compute ops are held to no target
    by_design: int = 0  # compute ops native by design (see the module docstring)
    cuts: int = 0  # native compute nodes outside engines reading an engine's output: where another engine starts
    fallbacks: int = 0  # native segment runs while serving (dispatcher stats, fresh process)
    build_failures: int = 0  # failed builds while serving (fresh process)
    max_abs_error: Optional[float] = None  # over every output (the raw outputs where the model names them)
    rel_error: Optional[float] = None  # max over those outputs of max|got - want| / max|want|
    decoded_rel_error: Optional[float] = None  # the same over the outputs decoded from the raw ones
    keras_fp16_rel_error: Optional[float] = None  # FP16 of a keras_fp16_reference model: Keras's own (printed)
    tf_kernels_error: Optional[float] = None  # FP32 of a tf_kernels_reference model: TF's oneDNN vs Eigen (printed)
    #: op type -> {reason: count} of the nodes left native (the non-conversion report), bookkeeping left out
    native_ops: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)
    #: why engine ops ran their native segment: after build() (the converter's process) and when serving
    native_runs: List[str] = dataclasses.field(default_factory=list)
    warnings: List[str] = dataclasses.field(default_factory=list)  # tftrt_py warnings during convert/build/save
    serve_error: Optional[str] = None
    batch1: Optional[BatchOneResult] = None  # None where the built batch did not serve

    @property
    def ops_held(self) -> int:
        """Compute ops held to the engine target: all but those native by design."""
        return self.ops_total - self.by_design

    @property
    def in_engines(self) -> float:
        return self.ops_in_engines / self.ops_held if self.ops_held else 0.0

    @property
    def in_engines_target(self) -> float:
        return TARGETS["in_engines_with_loops" if self.loops else "in_engines"]

    @property
    def target(self) -> float:
        """The bound on `error`: the issue's; for FP16 of a model whose fp16 Keras itself cannot compute within it,
        twice Keras's own mixed_float16 error on the same weights and inputs; for FP32 of a model whose outputs TF's
        own two CPU kernel sets do not agree on within it, twice their difference."""
        if self.precision == "FP16" and self.keras_fp16_rel_error is not None:
            return max(TARGETS["FP16"], 2 * self.keras_fp16_rel_error)
        if self.precision == "FP32" and self.tf_kernels_error is not None:
            return max(TARGETS["FP32"], 2 * self.tf_kernels_error)
        return TARGETS[self.precision]

    @property
    def error(self) -> Optional[float]:
        """The error the target applies to: FP32's max abs error, relative past an output magnitude of 1 (float32
        rounding scales with the values); FP16's relative to the output scale."""
        return _error(self.precision, self.max_abs_error, self.rel_error)

    @property
    def error_batch1(self) -> Optional[float]:
        """`error` at batch 1 (held to the same target)."""
        return None if self.batch1 is None else _error(self.precision, self.batch1.max_abs_error,
                                                       self.batch1.rel_error)

    def failures(self) -> List[str]:
        """The issue's targets this precision misses, one line each."""
        out = []
        if self.convert_error or self.serve_error:
            return [f"{self.precision}: {self.convert_error or self.serve_error}"]
        if self.error is None or not self.error <= self.target:
            out.append(f"{self.precision}: error {self.error} > {self.target:.3g}")
        if self.precision == "FP32" and self.decoded_rel_error is not None and \
                not self.decoded_rel_error <= TARGETS["decoded"]:
            out.append(f"FP32: decoded outputs' relative error {self.decoded_rel_error:.3g} > {TARGETS['decoded']:g}")
        if self.in_engines < self.in_engines_target:
            out.append(f"{self.precision}: {100 * self.in_engines:.1f}% of compute ops serve in engines "
                       f"[{self.ops_in_engines}/{self.ops_held}] < {100 * self.in_engines_target:g}%")
        if self.fallbacks:
            out.append(f"{self.precision}: {self.fallbacks} native fallback(s) serving the shapes built")
        return out + self.batch1_failures()

    def batch1_failures(self) -> List[str]:
        """The targets this precision misses at batch 1, one line each."""
        one = self.batch1
        if one is None:
            return []
        if one.serve_error:
            return [f"{self.precision} batch 1: {one.serve_error}"]
        out = []
        if self.error_batch1 is None or not self.error_batch1 <= self.target:
            out.append(f"{self.precision} batch 1: error {self.error_batch1} > {self.target:.3g}")
        if self.precision == "FP32" and one.decoded_rel_error is not None and \
                not one.decoded_rel_error <= TARGETS["decoded"]:
            out.append(f"FP32 batch 1: decoded outputs' relative error {one.decoded_rel_error:.3g} > "
                       f"{TARGETS['decoded']:g}")
        if one.expected_fallbacks:
            out.append(f"{self.precision} batch 1: {one.expected_fallbacks} native fallback(s) of engine ops that are "
                       f"row-wise or build at run time")
        return out


@dataclasses.dataclass
class ModelResult:
    name: str
    export_error: Optional[str] = None
    results: Dict[str, PrecisionResult] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def top_native(self, n=4) -> List[str]:
        """The op types most often left native (FP32), with their most frequent reason."""
        result = self.results.get("FP32")
        if result is None:
            return []
        table = sorted(result.native_ops.items(), key=lambda kv: -sum(kv[1].values()))
        return [f"{op} x{sum(reasons.values())}: {max(reasons, key=reasons.get)}" for op, reasons in table[:n]]


# -- fresh processes ---------------------------------------------------------------------------------------------
_EXPORT = """
import json, sys, numpy as np, tensorflow as tf
from zoo.models import ZOO, export, make_feed, mixed_float16_outputs
job = json.loads(sys.stdin.read())
model = ZOO[job["name"]]
built = export(model, job["native"])
fn = tf.saved_model.load(job["native"]).signatures["serving_default"]
specs = fn.structured_input_signature[1]
arrays = {}
for kind, seed, batch in (("build", 1, None), ("serve", 2, None), ("serve1", 3, 1)):
    for k, v in make_feed(model, specs, seed, batch).items():
        arrays[f"{kind}/{k}"] = v
# in the serving process's order: the built batch, then batch 1 (a model writing variables as it serves sees the same)
for kind, into in (("serve", "native"), ("serve1", "native1")):
    out = fn(**{k.split("/", 1)[1]: tf.constant(v) for k, v in arrays.items() if k.startswith(kind + "/")})
    arrays.update({f"{into}/{k}": v.numpy() for k, v in out.items()})
if model.keras_fp16_reference:
    (key,) = out
    arrays[f"keras_fp16/{key}"] = mixed_float16_outputs(
        model, built, {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("serve/")})
np.savez(job["arrays"], **arrays)
print(json.dumps({}))
"""

_NATIVE = """
import json, sys, numpy as np, tensorflow as tf
job = json.loads(sys.stdin.read())
arrays = np.load(job["arrays"])
fn = tf.saved_model.load(job["native"]).signatures["serving_default"]
out = fn(**{k.split("/", 1)[1]: tf.constant(arrays[k]) for k in arrays.files if k.startswith("serve/")})
np.savez(job["outputs"], **{k: v.numpy() for k, v in out.items()})
print(json.dumps({}))
"""

_SERVE = """
import json, sys, numpy as np, tensorflow as tf
from tftrt_py import trt_convert  # loads the TRTEngineOp library before the SavedModels
from tftrt_py.engine_op import dispatcher
job = json.loads(sys.stdin.read())
arrays = np.load(job["arrays"])
feeds = {kind: {k.split("/", 1)[1]: tf.constant(arrays[k]) for k in arrays.files if k.startswith(kind + "/")}
         for kind in ("serve", "serve1")}

def state(op):
    return {"stats": op.stats.as_dict(), "copies": op.batch_copies,
            "rowwise": any(getattr(e, "rowwise", False) for e in op.engines()),
            "native": [[[list(s) for s in shapes], f"{op.name}, input shapes {[list(s) for s in shapes]}: {why}"]
                       for shapes, why in op.native.items()]}

result = {}
for precision, directory in job["converted"].items():
    before = set(dispatcher.engine_ops())
    served = result[precision] = {}
    try:
        fn = tf.saved_model.load(directory).signatures["serving_default"]
    except Exception as exc:
        served["serve"] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        continue
    for kind in ("serve", "serve1"):  # the built batch, then batch 1
        try:
            out = fn(**feeds[kind])
        except Exception as exc:
            served[kind] = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
            break
        np.savez(job["outputs"][kind][precision], **{k: v.numpy() for k, v in out.items()})
        # engine ops are keyed by (segment key, function name, binding); the converted graph names the segment key
        served[kind] = {"ops": {key[0].decode() if isinstance(key[0], bytes) else key[0]: state(op)
                                for key, op in dispatcher.engine_ops().items() if key not in before}}
print(json.dumps(result))
"""


def _run_fresh(code, job, timeout=900, **environ):
    """Run `code` in a fresh Python with `job` as JSON on stdin (and `environ` set); (its last line's JSON, None)
    or (None, error)."""
    path = os.pathsep.join(p for p in (REPO, os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3", **environ)
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(job), capture_output=True, text=True,
                          env=env, timeout=timeout)
    if proc.returncode:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        return None, (lines[-1] if lines else f"exit status {proc.returncode}")[:500]
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


# -- counting ----------------------------------------------------------------------------------------------------
def _compute(ops) -> int:
    return sum(1 for op in ops if op not in BOOKKEEPING)


def _called_functions(node):
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        for func in value.list.func:
            yield func.name


def _native_compute(graph_def, nodes=None) -> int:
    """Compute ops outside engine ops: top-level `nodes` (default: all) and, recursively, the functions they
    call."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    seen, count = set(), 0
    stack = [n for n in (graph_def.node if nodes is None else nodes) if n.op != ENGINE_OP]
    while stack:
        node = stack.pop()
        count += node.op not in BOOKKEEPING
        for name in _called_functions(node):
            if name in functions and name not in seen:
                seen.add(name)
                stack.extend(functions[name].node_def)
    return count


def _native_by_design(graph_def, static_kept) -> int:
    """Compute ops native by design (see the module docstring)."""
    from tftrt_py.convert.graph import GraphView, tensor_ref

    view = GraphView(graph_def)

    def opaque(node):
        refs = list(node.inputs) + [tensor_ref(node.name, i) for i in range(view.num_outputs(node.name))]
        return any(view.dtype(r) in OPAQUE for r in refs)

    design = {n.name for n in graph_def.node if n.op != ENGINE_OP and (n.op in LOOPS or opaque(view.nodes[n.name]))}
    for node in reversed(view.topological_order()):
        users = view.consumers[node.name]
        if node.name in static_kept and users and all(u in design for u in users):
            design.add(node.name)
    return _native_compute(graph_def, [n for n in graph_def.node if n.name in design])


def _allow_build(saved_model_dir) -> Dict[str, bool]:
    """Segment key -> whether the engine op may build engines at run time, as the saved model's TRTEngineOps say
    (their ``_allow_build_at_runtime`` attribute, set when saving; absent: allowed, as the kernel reads it)."""
    from tensorflow.core.protobuf import saved_model_pb2

    from tftrt_py.convert.rewrite import ALLOW_BUILD_ATTR

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    out = {}
    for meta in saved.meta_graphs:
        graph = meta.graph_def
        for node in list(graph.node) + [n for f in graph.library.function for n in f.node_def]:
            if node.op == ENGINE_OP:
                out[node.attr["segment_key"].s.decode()] = \
                    node.attr[ALLOW_BUILD_ATTR].b if ALLOW_BUILD_ATTR in node.attr else True
    return out


def _cuts(graph_def) -> int:
    """Native compute nodes outside engines reading an engine's output."""
    engines = {n.name for n in graph_def.node if n.op == ENGINE_OP}
    return sum(1 for n in graph_def.node if n.op not in BOOKKEEPING and n.op != ENGINE_OP
               and any(r.lstrip("^").split(":")[0] in engines for r in n.input))


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: List[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage()[:400])


def _errors(got: Dict[str, np.ndarray], want: Dict[str, np.ndarray]):
    """(max abs error, max relative error) over the outputs of `want`."""
    abs_err, rel_err = 0.0, 0.0
    for key, w in want.items():
        g = np.asarray(got[key], np.float64)
        w = np.asarray(w, np.float64)
        if g.shape != w.shape:
            return float("inf"), float("inf")
        err = float(np.max(np.abs(g - w))) if w.size else 0.0
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        abs_err = max(abs_err, err)
        rel_err = max(rel_err, err / scale if scale else (0.0 if err == 0 else float("inf")))
    return abs_err, rel_err


# -- one model ---------------------------------------------------------------------------------------------------
def _convert(native_dir, precision, arrays, out_dir, result: PrecisionResult):
    """Convert, build for the build inputs, save; fills `result`'s conversion fields; (the converted graph, the
    nodes left native as known when building), or None."""
    import tensorflow as tf
    from tftrt_py import trt_convert as trt
    from tftrt_py.converters import summary as summary_lib
    from tftrt_py.segmenter.segmentation import STATIC_KEPT

    handler = _Warnings()
    log = logging.getLogger("tftrt_py")
    log.addHandler(handler)
    try:
        converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir, precision_mode=precision)
        converter.convert()
        report = converter._report
        result.native_ops = {op: dict(reasons) for op, reasons in report.by_op_type().items()
                             if op not in BOOKKEEPING}
        feed = {k.split("/", 1)[1]: tf.constant(arrays[k]) for k in arrays.files if k.startswith("build/")}
        converter.build(input_fn=lambda: iter([feed]))
        counts = summary_lib.engine_op_counts(converter._converted_graph_def)
        result.native_runs += summary_lib.describe_native_runs(converter.native_engine_ops(), counts)
        converter.save(out_dir)
        return converter._converted_graph_def, {name for name, (_, why) in report.node_reasons.items()
                                                 if why == STATIC_KEPT}
    except Exception as exc:  # a measurement: the error is the result
        result.convert_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        return None
    finally:
        log.removeHandler(handler)
        result.warnings = handler.lines


def _tf_kernels_spread(name: str, native_dir: str, arrays_path: str, workdir: str,
                       want: Dict[str, np.ndarray]) -> Optional[float]:
    """How far TF's outputs of a tf_kernels_reference model with oneDNN's kernels and with Eigen's (fresh processes,
    TF_ENABLE_ONEDNN_OPTS 1 and 0: whichever the host defaults to) lie from `want` at most (None for other models)."""
    from zoo.models import ZOO

    if not ZOO[name].tf_kernels_reference:
        return None
    spread = 0.0
    for onednn in ("0", "1"):
        path = os.path.join(workdir, f"outputs_tf_onednn_{onednn}.npz")
        _, error = _run_fresh(_NATIVE, {"native": native_dir, "arrays": arrays_path, "outputs": path},
                              TF_ENABLE_ONEDNN_OPTS=onednn)
        if error:  # held to the plain target then
            logging.getLogger(__name__).warning("%s: TF with TF_ENABLE_ONEDNN_OPTS=%s failed: %s", name, onednn, error)
            return None
        spread = max(spread, min(_errors(dict(np.load(path)), want)))
    return spread


def measure(name: str, workdir: str, precisions=PRECISIONS) -> ModelResult:
    """Measure zoo model `name` (see zoo.models.ZOO), working in `workdir`."""
    start = time.time()
    model = ModelResult(name)
    native_dir = os.path.join(workdir, "native")
    arrays_path = os.path.join(workdir, "arrays.npz")
    _, error = _run_fresh(_EXPORT, {"name": name, "native": native_dir, "arrays": arrays_path})
    if error:
        model.export_error = error
        model.seconds = time.time() - start
        return model
    arrays = np.load(arrays_path)
    want = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("native/")}
    want1 = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("native1/")}
    keras_fp16 = {k.split("/", 1)[1]: arrays[k] for k in arrays.files if k.startswith("keras_fp16/")}
    graphs, converted, outputs = {}, {}, {"serve": {}, "serve1": {}}
    for precision in precisions:
        result = model.results[precision] = PrecisionResult(precision)
        converted[precision] = os.path.join(workdir, precision.lower())
        for kind in outputs:
            outputs[kind][precision] = os.path.join(workdir, f"outputs_{kind}_{precision.lower()}.npz")
        graphs[precision] = _convert(native_dir, precision, arrays, converted[precision], result)
    serving = {p: d for p, d in converted.items() if graphs[p] is not None}
    served, error = (_run_fresh(_SERVE, {"arrays": arrays_path, "converted": serving, "outputs": outputs})
                     if serving else ({}, None))
    from zoo.models import ZOO

    tf_kernels_spread = _tf_kernels_spread(name, native_dir, arrays_path, workdir, want)
    for precision, converted_graph in graphs.items():
        if precision == "FP16" and keras_fp16:
            _, model.results[precision].keras_fp16_rel_error = _errors(keras_fp16, want)
        if precision == "FP32":
            model.results[precision].tf_kernels_error = tf_kernels_spread
        if converted_graph is not None:
            _score(model.results[precision], *converted_graph, (served or {}).get(precision) or {}, error,
                   {kind: paths[precision] for kind, paths in outputs.items()}, (want, want1), ZOO[name].raw_outputs,
                   _allow_build(converted[precision]))
    model.seconds = time.time() - start
    return model


def _score(result: PrecisionResult, graph_def, static_kept, served, error, outputs, wants, raw_outputs, allow_build):
    """Fill `result`'s counts from `graph_def` and the serving process's report `served` ({"serve": ..., "serve1":
    ...}: each {"ops": segment key -> state} or {"error": ...}); errors from the outputs saved at `outputs` (kind ->
    path) against `wants` (native TF's at the built batch and at batch 1). `allow_build`: segment key -> whether
    the saved engine op may build at run time."""
    from tftrt_py.converters.summary import engine_op_counts

    counts = engine_op_counts(graph_def)
    keys = {n.name: n.attr["segment_key"].s.decode() for n in graph_def.node if n.op == ENGINE_OP}
    result.engines = len(counts)
    outside = _native_compute(graph_def)
    result.ops_total = outside + sum(_compute(c.elements()) for c in counts.values())
    result.loops = any(n.op in LOOPS for n in graph_def.node)
    result.by_design = _native_by_design(graph_def, static_kept)
    result.cuts = _cuts(graph_def)
    built = served.get("serve") or {}
    if "ops" not in built:
        result.serve_error = built.get("error") or error or "no result from the serving process"
        return
    ops = built["ops"]
    for name, counter in counts.items():
        op = ops.get(keys[name])
        if op is None:
            result.native_runs.append(f"{name}: did not run when serving")
            continue
        stats = op["stats"]
        result.fallbacks += stats["fallback_total"]
        result.build_failures += stats["build_failures"]
        result.native_runs += [f"serving: {line}" for _, line in op["native"]]
        if stats["engine_runs"] > 0 and stats["fallback_total"] == 0:
            result.serving_engines += 1
            result.ops_in_engines += _compute(counter.elements())
    want, want1 = wants
    result.max_abs_error, result.rel_error, result.decoded_rel_error = _compare(outputs["serve"], want, raw_outputs)

    one = result.batch1 = BatchOneResult()
    at_one = served.get("serve1") or {}
    if "ops" not in at_one:
        one.serve_error = at_one.get("error") or "no result from the serving process"
        return
    for name in counts:
        before, after = ops.get(keys[name]), at_one["ops"].get(keys[name])
        if after is None:
            continue
        grew = lambda stat: after["stats"][stat] - (before["stats"][stat] if before else 0)  # noqa: E731
        fallbacks, builds = grew("fallback_total"), grew("builds")
        rowwise = bool(before and before["rowwise"])
        one.fallbacks += fallbacks
        one.expected_fallbacks += fallbacks if rowwise or allow_build.get(keys[name], True) else 0
        one.builds += builds
        one.build_failures += grew("build_failures")
        one.copies += after["copies"] - (before["copies"] if before else 0)
        one.rowwise += int(rowwise and grew("hits") > 0 and not builds and not fallbacks)
        seen = [shapes for shapes, _ in before["native"]] if before else []
        one.native_runs += [f"batch 1: {line}" for shapes, line in after["native"] if shapes not in seen]
    one.max_abs_error, one.rel_error, one.decoded_rel_error = _compare(outputs["serve1"], want1, raw_outputs)


def _compare(outputs_path, want, raw_outputs):
    """(max abs error, relative error, decoded outputs' relative error or None) of the outputs saved at
    `outputs_path` against `want`: over the raw outputs where the model names them, else over all."""
    got = dict(np.load(outputs_path))
    raw = {k: v for k, v in want.items() if k in raw_outputs} or want
    abs_err, rel_err = _errors(got, raw)
    decoded = _errors(got, {k: v for k, v in want.items() if k not in raw})[1] if raw_outputs else None
    return abs_err, rel_err, decoded
