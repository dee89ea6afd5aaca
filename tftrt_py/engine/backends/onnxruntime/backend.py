"""The ONNX Runtime backend: an engine becomes a program of ONNX Runtime sessions (the lowered network)
and, for the rare kinds without a lowering (registry.NUMPY_KINDS), numpy kernels between them."""
from __future__ import annotations

import logging
import time
from typing import AbstractSet, Dict, List, Mapping, Optional, Sequence

import numpy as np

from tftrt_py.engine.backends import base
from tftrt_py.engine.backends.base import Backend, Call, deliver, strict_types
from tftrt_py.engine.backends.numpy_backend import LayerStep, NumpyBackend
from tftrt_py.engine.backends.onnxruntime.graph import prune
from tftrt_py.engine.backends.onnxruntime.int8 import EMULATED
from tftrt_py.engine.backends.onnxruntime.lowering import NUMPY_KINDS, lower, lowerable
from tftrt_py.engine.backends.onnxruntime.probe import available
from tftrt_py.engine.backends.threads import cpu_threads
from tftrt_py.engine.errors import BackendError, BuildError, RuntimeExecutionError
from tftrt_py.engine.network import Layer, Network, Tensor

__all__ = ["OnnxRuntimeBackend", "Program", "DISABLED_OPTIMIZERS", "SESSION_CONFIG"]

logger = logging.getLogger(__name__)

#: ONNX Runtime (1.32) graph optimizers turned off, and why:
DISABLED_OPTIMIZERS = (
    # moves a DequantizeLinear past a Transpose by adding a QuantizeLinear whose zero point is uint8 for int8
    # data, which ORT then rejects: our QDQ pairs sit where they belong already
    "QDQPropagationTransformer",
    # quantize the fp32 weights of a convolution fed by a DequantizeLinear (per tensor), then fuse it into
    # QLinearConv: the int8 lowering's fp32 convolutions on dequantized values must stay as written
    "WeightBiasQuantization", "QDQSelectorActionTransformer",
    # its SkipLayerNormalization ran 10-20x slower than the Add + LayerNormalization it replaces on an AVX2
    # x86 CPU ([8, 128, 768]: 9.6-16.7 ms against 0.74-0.87 ms; BERT-base batch 8 lost ~10% to it)
    "SkipLayerNormFusion",
    # would turn the Normalization lowering's float32 steps back into LayerNormalization, which sums in double
    # (finite answers where TF's float32 sums overflow)
    "LayerNormFusion",
)

#: Timed runs of each lowering when an INT8 engine chooses between its int8 layers and FP16 (after one untimed run).
CHOICE_RUNS = 2

#: Layers per session of OnnxRuntimeBackend.recording_steps: each session returns every
#: tensor its layers compute, so a bounded count bounds what one step holds at once.
RECORDING_LAYERS = 24

#: Session settings: threads sleep when idle instead of spinning (on a machine whose cores other processes also
#: use, spinning workers took 1.2-1.5x longer per run: Keras ResNet50 and BERT-base on 2 shared CPUs). Spinning only
#: while a run lasts (session.force_spinning_stop) is no better there: the zoo's RetinaNet engine at batch 8 took
#: 16.7 ms instead of 11.9 beside a process holding one of 2 CPUs, for 8.8 instead of 9.3 on idle ones.
SESSION_CONFIG = {"session.intra_op.allow_spinning": "0"}

#: Engines whose run takes less than this (ms, with every thread allowed) are also made with one intra-op thread,
#: kept where it runs in under ONE_THREAD_GAIN of the time (see OnnxRuntimeBackend._keep_fewer_threads).
ONE_THREAD_TRIAL_MS = 25.0
ONE_THREAD_GAIN = 0.9


class _Session:
    """One ONNX Runtime session over consecutive lowered layers: engine tensors in, engine tensors out."""

    def __init__(self, session, inputs: List[Tensor], outputs: List[Tensor], layers: List[Layer],
                 weights: Sequence[np.ndarray] = ()):
        self.session, self.inputs, self.outputs, self.layers = session, inputs, outputs, layers
        self.weights = list(weights)  # the arrays the session reads in place: they live as long as it does
        self.input_names = [i.name for i in session.get_inputs()]

    def runner(self):
        """(run, output names): the session's own run(output names, feeds, run options), without the checks of
        InferenceSession.run, which a caller feeding every input needs no more than the error it raises."""
        sess = getattr(self.session, "_sess", None)
        names = [o.name for o in self.session.get_outputs()]
        return (sess.run if sess is not None else self.session.run), names

    def run(self, values: Dict[str, np.ndarray]) -> None:
        feeds = {name: values[t.name] for name, t in zip(self.input_names, self.inputs)}
        for t, out in zip(self.outputs, self.session.run(None, feeds)):
            values[t.name] = out


class Program:
    """An engine's steps: sessions over runs of lowered layers, numpy layers between them."""

    def __init__(self, steps: list):
        self.steps = steps

    def run(self, inputs: Dict[str, np.ndarray], profiler=None) -> Dict[str, np.ndarray]:
        """The values of every tensor the steps make from `inputs`; with a `profiler`, each step's wall time is
        reported as its (one) layer's (see :meth:`OnnxRuntimeBackend.profiling_program`)."""
        values = dict(inputs)
        for step in self.steps:
            start = time.perf_counter() if profiler is not None else 0.0
            step.run(values)
            if profiler is not None:
                profiler.report_layer_time(step.layers[-1].name, (time.perf_counter() - start) * 1e3)
        return values


def _run_ms(program: Program, feed: Dict[str, np.ndarray]) -> float:
    """The fastest of CHOICE_RUNS runs of `program` on `feed`, after one untimed run, in ms."""
    program.run(feed)
    best = float("inf")
    for _ in range(CHOICE_RUNS):
        start = time.perf_counter()
        program.run(feed)
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def _runs(layers: List[Layer]) -> List[List[Layer]]:
    """Consecutive layers grouped by whether ONNX Runtime runs them."""
    runs: List[List[Layer]] = []
    for layer in layers:
        if runs and lowerable(runs[-1][-1]) == lowerable(layer):
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


class OnnxRuntimeBackend(Backend):
    """Runs engines on the CPU with ONNX Runtime (graph optimizations on; threads from :meth:`threads`)."""

    name = "onnxruntime"
    #: FP8 layers compute in fp32 here (lowering.py).
    precisions = ("FP32", "FP16", "INT8")
    #: Not Convolution: its NCHWc kernels run two sibling convolutions about as fast as one merged convolution,
    #: and each Slice after a merged one changes layout (NCHWc to NCHW and back): the zoo's RetinaNet engine at
    #: batch 8 (its two heads' first convolutions on three levels) took 9.7 ms merged, 9.3 apart.
    horizontal_kinds = ("MatrixMultiply",)

    def __init__(self):
        ok, why = available()
        if not ok:
            raise BackendError(why)
        import onnxruntime

        self._ort = onnxruntime
        self._said = set()

    def threads(self) -> Optional[int]:
        """Intra-op threads of the sessions this backend makes: what the process allows (threads.cpu_threads)."""
        return cpu_threads()

    def session(self, model, external: Optional[dict] = None, shared: Sequence[np.ndarray] = (),
                threads: Optional[int] = None):
        """An InferenceSession of ONNX `model` (pruned, from its bytes: no file), every graph optimization on but
        those DISABLED_OPTIMIZERS names, with SESSION_CONFIG and `threads` intra-op threads (default:
        :meth:`threads`); `external` gives the arrays of the initializers the
        model names as external data (see lowering.lower). Of those, the ones among `shared` (arrays that live
        while the session does: the layers' own weights) are the session's initializers themselves
        (``SessionOptions.add_initializer``: no copy kept, and none made beside the one that prepacking packs
        into); the others are copied once into the session's graph."""
        ort = self._ort
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        options.add_session_config_entry("optimization.disable_specified_optimizers", ";".join(DISABLED_OPTIMIZERS))
        for key, value in SESSION_CONFIG.items():
            options.add_session_config_entry(key, value)
        threads = threads or self.threads()
        if threads:
            options.intra_op_num_threads = int(threads)
        model = prune(model)
        live = {w.name for w in model.graph.initializer}
        names = [name for name in external or () if name in live]
        if names:  # the options let the copied ones go once the session is made
            values = [ort.OrtValue.ortvalue_from_numpy(external[n]) for n in names]
            options.add_external_initializers(names, values)
            owned = {id(a) for a in shared}
            for name, value in zip(names, values):
                if id(external[name]) in owned:
                    options.add_initializer(name, value)
        return ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                    providers=["CPUExecutionProvider"])

    # -- build --------------------------------------------------------------------------------------------
    def recording_steps(self, network: Network) -> list:
        """Steps computing every tensor of `network` as it stands (no builder passes), each leaving all the
        tensors it computes in the values it runs on: sessions of at most RECORDING_LAYERS consecutive lowered
        layers (ONNX Runtime fuses nothing across a graph output), numpy layers between them. INT8 calibration
        runs the FP32 network through them, recording each step's tensors (calibration.collector)."""
        return self._program(network, every_tensor=True).steps

    def _program(self, network: Network, per_layer: bool = False, every_tensor: bool = False,
                 threads: Optional[int] = None) -> Program:
        """The sessions and numpy steps running `network`: one session per run of consecutive lowered layers, or
        one per layer (`per_layer`); with `every_tensor`, runs of at most RECORDING_LAYERS layers whose sessions
        return all the tensors they compute; `threads`: the sessions' intra-op threads (default: :meth:`threads`)."""
        users: Dict[str, int] = {}  # tensor -> the last layer reading it (past the end: returned)
        if every_tensor:
            users = dict.fromkeys((t.name for layer in network.layers for t in layer.outputs), len(network.layers))
        else:
            for i, layer in enumerate(network.layers):
                for t in layer.inputs:
                    users[t.name] = i
            for t in network.outputs:
                users[t.name] = len(network.layers)
        steps, start = [], 0
        runs = [[layer] for layer in network.layers] if per_layer else _runs(network.layers)
        if every_tensor:
            runs = [run[i:i + RECORDING_LAYERS] for run in runs for i in range(0, len(run), RECORDING_LAYERS)]
        for run in runs:
            end = start + len(run)
            if not lowerable(run[0]):
                for layer in run:
                    if layer.kind not in self._said:
                        self._said.add(layer.kind)
                        logger.warning("%s layers run on numpy between ONNX Runtime sessions: %s", layer.kind,
                                       NUMPY_KINDS.get(layer.kind, "no lowering"))
                    steps.append(LayerStep(layer))
            else:
                made = {t.name for layer in run for t in layer.outputs}
                inputs = list({t.name: t for layer in run for t in layer.inputs if t.name not in made}.values())
                outputs = list({t.name: t for layer in run for t in layer.outputs
                                if users.get(t.name, -1) >= end}.values())
                external = {}
                model = lower(network, run, inputs, outputs, external=external)
                weights = [w for layer in run for w in layer.weights.values()]
                steps.append(_Session(self.session(model, external, weights, threads), inputs, outputs, run,
                                      weights))
            start = end
        return Program(steps)

    def prepare_engine(self, engine) -> None:
        """Lower `engine` to ONNX and make its sessions (once per engine); an INT8 engine keeps its int8 layers
        only where they run faster (:meth:`_keep_faster`)."""
        try:
            strict = strict_types(engine.build_config)
            if not strict:
                _demote_emulated(engine.network)
            engine.ort_program = self._program(engine.network)
            if not strict:
                self._keep_faster(engine)
            self._keep_fewer_threads(engine)
        except BackendError:
            raise
        except Exception as exc:
            raise BuildError(f"building engine {engine.name!r} for ONNX Runtime failed: {type(exc).__name__}: "
                             f"{exc}") from exc

    def _keep_faster(self, engine) -> None:
        """TensorRT's INT8 mode runs a layer in higher precision where that is faster, unless types are strict. Here
        the choice is the engine's as a whole (ONNX Runtime times sessions, not layers): its lowering with the INT8
        layers and with them in FP16 (fp32 on the CPU) run on zeros, and where FP16 is faster those layers become
        FP16 (``layer.precision``: the plan, inspect() and the numpy backend say what runs). MobileNetV2 is one
        such network on a CPU: its depthwise and relu6 convolutions have no exact int8 kernel and run fp32 on
        dequantized values, with layout changes around each, so its INT8 lowering took 1.8x FP32's time."""
        net = engine.network
        int8 = [layer for layer in net.layers if layer.precision == "INT8"]
        if not int8 or any(d < 0 for t in net.inputs for d in t.shape):
            return
        feed = {t.name: np.zeros(t.shape, t.dtype) for t in net.inputs}
        try:
            int8_ms = _run_ms(engine.ort_program, feed)
            for layer in int8:
                layer.precision = "FP16"
            fp16_program = self._program(net)
            fp16_ms = _run_ms(fp16_program, feed)
        except Exception as exc:  # (zeros may not suit a numpy step): the INT8 lowering stays
            logger.debug("engine %s: INT8 kept untimed: %s: %s", engine.name, type(exc).__name__, exc)
            fp16_ms = int8_ms = 0.0
        logger.debug("engine %s: INT8 %.2f ms, FP16 %.2f ms", engine.name, int8_ms, fp16_ms)
        if fp16_ms < int8_ms:
            engine.ort_program = fp16_program
            logger.info("engine %s: its %d INT8 layers run in FP16, faster on this CPU (%.2f against %.2f ms)",
                        engine.name, len(int8), fp16_ms, int8_ms)
            return
        for layer in int8:
            layer.precision = "INT8"

    def _keep_fewer_threads(self, engine) -> None:
        """ONNX Runtime splits an op over its intra-op threads by the op's size; threads that sleep when idle
        (SESSION_CONFIG) take tens of microseconds to wake, more than a small op gains from them. An engine of many
        small layers (an unrolled LSTM: 2,200 layers of at most 0.5 MFLOP at batch 1) ran 1.5-1.8x faster on one
        thread than on two. So an engine running in under ONE_THREAD_TRIAL_MS is also made with one thread, both
        run on zeros, and one thread kept where it takes under ONE_THREAD_GAIN of the time."""
        net = engine.network
        if (self.threads() or 1) <= 1 or any(d < 0 for t in net.inputs for d in t.shape):
            return
        feed = {t.name: np.zeros(t.shape, t.dtype) for t in net.inputs}
        try:
            many_ms = _run_ms(engine.ort_program, feed)
            if many_ms >= ONE_THREAD_TRIAL_MS:
                return
            one = self._program(net, threads=1)
            one_ms = _run_ms(one, feed)
        except Exception as exc:  # (zeros may not suit a numpy step): the threads stay
            logger.debug("engine %s: threads kept untimed: %s: %s", engine.name, type(exc).__name__, exc)
            return
        logger.debug("engine %s: %d threads %.3f ms, one %.3f ms", engine.name, self.threads(), many_ms, one_ms)
        if one_ms < ONE_THREAD_GAIN * many_ms:
            engine.ort_program, engine.ort_threads = one, 1
            logger.info("engine %s runs on one thread, faster on this CPU (%.3f against %.3f ms)", engine.name,
                        one_ms, many_ms)

    @property
    def kinds(self) -> AbstractSet[str]:
        """Every reference kind: those without a lowering run on numpy between sessions."""
        return NumpyBackend().kinds

    def profiling_program(self, engine) -> Program:
        """`engine`'s layers in sessions of one layer each (made on first use): a profiler gets each layer's time.
        ONNX Runtime's own fusions across layers do not happen there, so the layers' times add up to more than a
        run of the engine's program takes."""
        program = getattr(engine, "ort_profiling_program", None)
        if program is None:
            program = engine.ort_profiling_program = self._program(engine.network, per_layer=True,
                                                                   threads=getattr(engine, "ort_threads", None))
        return program

    # -- run ------------------------------------------------------------------------------------------------
    def create_runner(self, engine) -> "Runner":
        if getattr(engine, "ort_program", None) is None:
            engine.prepare()
        return Runner(engine, engine.ort_program, lambda: self.profiling_program(engine), self._ort)


def _demote_emulated(net) -> None:
    """INT8 layers whose lowering only emulates their rounding (int8.EMULATED: attention) become FP16, as TensorRT
    runs a layer in higher precision where its int8 kernel is no faster (here there is none)."""
    demoted = [layer for layer in net.layers if layer.precision == "INT8" and layer.kind in EMULATED]
    for layer in demoted:
        layer.precision = "FP16"
    if demoted:
        logger.debug("engine %s: %d INT8 layers without an int8 kernel on ONNX Runtime run in FP16", net.name,
                     len(demoted))


class Runner(base.Runner):
    """Runs one engine's program for one ExecutionContext (sessions are shared: ONNX Runtime runs them from
    several threads at once)."""

    def __init__(self, engine, program: Program, profiling_program, ort):
        self.engine, self.program, self.profiling_program, self._ort = engine, program, profiling_program, ort

    def execute(self, ctx, bindings: Mapping[str, np.ndarray], outputs=None) -> Dict[str, np.ndarray]:
        eng = self.engine
        values, batch = ctx._check_inputs(bindings)
        try:
            if ctx.profiler is None:
                values = self.program.run(values)
            else:  # per-layer times (Profiler): the engine's layers in sessions of their own
                values = self.profiling_program().run(values, ctx.profiler)
        except Exception as exc:
            raise RuntimeExecutionError(f"engine {eng.name!r} failed in ONNX Runtime: {type(exc).__name__}: "
                                        f"{exc}") from exc
        if not (batch is not None and eng.rowwise and batch < eng.max_batch_size):
            return {t.name: deliver(values[t.name], i, outputs) for i, t in enumerate(eng.outputs)}
        return {t.name: deliver(out, i, outputs, copy=ctx.padded_view(out))
                for i, t in enumerate(eng.outputs) for out in [values[t.name][:batch]]}

    def call(self, ctx) -> Call:
        """The program's run on inputs in binding order (its sessions are shared, so any thread may call it);
        an engine of one session reading every input and making every output runs it directly."""
        eng, program = self.engine, self.program
        in_names, out_names = [t.name for t in eng.inputs], [t.name for t in eng.outputs]
        step = program.steps[0] if len(program.steps) == 1 else None
        made = [t.name for t in step.outputs] if isinstance(step, _Session) else []
        if not (made and set(out_names) <= set(made) and [t.name for t in step.inputs] == in_names):

            def run_program(inputs, outputs=None):
                values = program.run(dict(zip(in_names, inputs)))
                return [deliver(values[name], i, outputs) for i, name in enumerate(out_names)]
            return run_program
        run, fetch = step.runner()
        order = [made.index(name) for name in out_names]
        names, options = step.input_names, self._ort.RunOptions()  # options: read-only during runs, shareable

        def run_session(inputs, outputs=None):
            outs = run(fetch, dict(zip(names, inputs)), options)
            if outputs is None:  # ONNX Runtime's outputs are C-contiguous arrays of their own
                return [outs[j] for j in order]
            return [deliver(outs[j], i, outputs) for i, j in enumerate(order)]
        return run_session


