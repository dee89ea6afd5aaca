"""Which quantized layers stay int8 (cupy program.settle_quantized): the precisions of least total time, where an
int8 layer also pays a quantize step for each operand no int8 layer writes, so a chain pays it once."""
import itertools

import numpy as np
import pytest
from networks import attention_block_net

from tftrt_py.engine.backends.cupy.quant_planning import _Costs, settle_quantized

INF = float("inf")


def chain(n, quantized, step, fp16):
    """c0 -> c1 -> ... : c0 reads the engine input (a step whatever runs), each other reads its predecessor."""
    costs = {f"c{i}": _Costs(quantized, {0: step}, fp16) for i in range(n)}
    writers = {f"c{i}": {0: f"c{i - 1}" if i else None} for i in range(n)}
    return costs, writers


def total(costs, writers, keep, fixed=frozenset()):
    t = 0.0
    for name, c in costs.items():
        if name in keep:
            t += c.quantized + sum(ms for i, ms in c.steps.items() if writers[name].get(i) not in keep | fixed)
        else:
            t += c.fp16
    return t


def test_a_chain_faster_in_int8_pays_its_quantize_step_once():
    costs, writers = chain(4, quantized=0.8, step=0.3, fp16=1.0)  # each layer charged a step would lose
    assert settle_quantized(costs, set(), writers) == {"c0", "c1", "c2", "c3"}


def test_a_chain_whose_step_outweighs_its_gain_stays_fp16():
    costs, writers = chain(2, quantized=0.9, step=0.5, fp16=1.0)  # 2.3 ms in int8 against 2.0
    assert settle_quantized(costs, set(), writers) == set()


def test_a_layer_without_a_quantized_kernel_runs_fp16_and_its_reader_pays_the_step():
    costs, writers = chain(3, quantized=0.5, step=0.2, fp16=1.0)
    costs["c1"] = _Costs(INF, {0: 0.2}, 1.0)
    assert settle_quantized(costs, set(), writers) == {"c0", "c2"}
    costs["c2"] = _Costs(0.9, {0: 0.2}, 1.0)  # 1.1 ms with its step: fp16 is faster
    assert settle_quantized(costs, set(), writers) == {"c0"}


def test_a_layer_recorded_int8_writes_its_readers_operands():
    costs, writers = chain(2, quantized=0.9, step=0.5, fp16=1.0)
    del costs["c0"]
    assert settle_quantized(costs, {"c0"}, writers) == {"c0", "c1"}
    assert settle_quantized(costs, set(), writers) == set()  # recorded fp16: c1 would pay the step


def test_the_choice_is_the_least_total_time_on_random_graphs():
    """Against every assignment of small random graphs (a residual network's shape: operands from any earlier
    layer or the input)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 7))
        costs, writers = {}, {}
        for k in range(n):
            name = f"l{k}"
            ops = int(rng.integers(1, 3))
            writers[name] = {i: (f"l{int(rng.integers(0, k))}" if k and rng.random() < 0.8 else None)
                             for i in range(ops)}
            quantized = INF if rng.random() < 0.1 else float(rng.uniform(0.2, 1.2))
            costs[name] = _Costs(quantized, {i: float(rng.uniform(0.0, 0.6)) for i in range(ops)}, 1.0)
        got = settle_quantized(costs, set(), writers)
        best = min(total(costs, writers, set(keep)) for r in range(n + 1)
                   for keep in itertools.combinations(costs, r))
        assert np.isclose(total(costs, writers, got), best), (costs, writers, got)


# -- which tensors stay quantized between layers (program.quantized_tensors) -----------------------------
def conv_net(name, pool=False, residual=False, mid_is_output=False):
    """x -> c1 (3x3 relu) -> [max pool] -> c2 (1x1, [+ c1's output]); every tensor with a range."""
    from tftrt_py.engine import Network

    rng = np.random.default_rng(0)
    net = Network(name)
    x = net.add_input("x", "float32", (2, 8, 8, 32))
    params = dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1], post_padding=[1, 1], groups=1)
    c1 = net.add_layer("Convolution", [x], dict(params, activation={"type": "relu"}),
                       {"kernel": rng.standard_normal((3, 3, 32, 32)).astype("float32")}, name="c1")
    mid = c1.outputs[0]
    if pool:
        mid = net.add_layer("Pooling", [mid], dict(type="max", window=[2, 2], strides=[2, 2], pre_padding=[0, 0],
                                                   post_padding=[0, 0]), name="pool").outputs[0]
    c2 = net.add_layer("Convolution", [mid] + ([c1.outputs[0]] if residual else []),
                       dict(params, pre_padding=[0, 0], post_padding=[0, 0]),
                       {"kernel": rng.standard_normal((1, 1, 32, 32)).astype("float32")}, name="c2")
    net.mark_output(c2.outputs[0], name="y")
    if mid_is_output:
        net.mark_output(c1.outputs[0], name="mid")
    for t in [x] + [t for layer in net.layers for t in layer.outputs]:
        t.dynamic_range = 4.0
    return net


def stored_between(net, precision, **layer_precisions):
    """(direct, dual) of the network as the builder leaves it (then the given layers' precisions set), every
    quantized layer kept."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program

    built = Builder(BuilderConfig(precision=precision)).build_engine(net).network
    for layer in built.layers:
        layer.precision = layer_precisions.get(layer.name, layer.precision)
    layers = program.quantized_layers(built, precision)
    return program.quantized_tensors(built, {**layers, **program.quantized_pools(built, precision)}, precision)


def test_int8_and_a_max_pool_pass_int8_values_along():
    assert stored_between(conv_net("pool", pool=True), "INT8")[0] >= {"c1:0", "pool:0"}


def test_fp8_layers_pass_e4m3_values_along_also_to_residuals():
    direct, dual = stored_between(conv_net("fp8", residual=True), "FP8")
    assert "c1:0" in direct and not dual


def test_a_quantized_tensor_also_read_as_a_float_is_written_twice():
    direct, dual = stored_between(conv_net("fp8", mid_is_output=True), "FP8")
    assert "mid" in dual and "mid" not in direct


def test_a_tensor_between_different_formats_stays_float():
    direct, dual = stored_between(conv_net("mixed"), "INT8", c2="FP8")
    assert "c1:0" not in direct | dual


def test_fp8_max_pools_pass_e4m3_values_along():
    assert stored_between(conv_net("pool", pool=True), "FP8")[0] >= {"c1:0", "pool:0"}


# -- LayerNorms that write their output quantized too (program.normalization_duals) -----------------------------
def norm_dense_net(view_range=4.0, width=64):
    """x -> LayerNorm [2, 8, width] -> reshape to rows [16, width] (as a converted Dense layer reads a sequence)
    -> dense; the LayerNorm's output has range 4, the rows `view_range`."""
    from tftrt_py.engine import Network

    rng = np.random.default_rng(3)
    net = Network("ln_rows")
    x = net.add_input("x", "float32", (2, 8, width))
    ln = net.add_layer("Normalization", [x], {"epsilon": 1e-6},
                       {"scale": np.ones(width, np.float32), "bias": np.zeros(width, np.float32)}, name="ln")
    rows = net.add_layer("Shuffle", [ln.outputs[0]], {"reshape": [16, width]}, name="rows").outputs[0]
    w = net.add_constant(rng.standard_normal((width, 32)).astype(np.float32), name="w")
    dense = net.add_layer("MatrixMultiply", [rows, w], {}, name="dense")
    net.mark_output(dense.outputs[0], name="y")
    x.dynamic_range, ln.outputs[0].dynamic_range, rows.dynamic_range = 3.0, 4.0, view_range
    return net


def duals(net, precision):
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program

    built = Builder(BuilderConfig(precision=precision)).build_engine(net).network
    return program.normalization_duals(built, program.quantized_layers(built, precision), precision)


def test_a_layernorm_read_as_rows_by_a_quantized_dense_layer_writes_its_output_quantized_too():
    for precision in ("INT8", "FP8"):
        assert duals(norm_dense_net(), precision) == {"rows:0": "ln"}


def test_rows_at_another_range_than_the_layernorms_output_get_a_quantize_step_of_their_own():
    assert duals(norm_dense_net(view_range=2.0), "INT8") == {}


def test_a_layernorm_whose_rows_quantized_kernels_would_pad_writes_no_quantized_copy():
    assert duals(norm_dense_net(width=60), "INT8") == {}


# -- attention between quantized projections (quantized_tensors through views, keep_faster_quantized) -----------
def attention_kernel_available(monkeypatch, reason=None):
    """The cupy backend's quantized attention kernel runs (or not, for `reason`) whether or not Triton is here."""
    from tftrt_py.engine.backends.cupy.ops import attention

    monkeypatch.setattr(attention, "quantized_reason", lambda layer: reason)


def test_an_attention_block_passes_quantized_values_from_projection_to_projection_through_views(monkeypatch):
    attention_kernel_available(monkeypatch)
    for precision in ("INT8", "FP8"):
        direct, dual = stored_between(attention_block_net(), precision)
        assert direct >= {"qkv:0", "qkv_seq:0", "attention:0", "context:0"} and not dual, (direct, dual)


def test_attention_the_backend_cannot_quantize_runs_fp16_and_its_neighbours_read_floats(monkeypatch):
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program

    attention_kernel_available(monkeypatch, "no Triton")
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    layers = program.quantized_layers(built, "INT8")
    assert set(layers) == {"qkv", "o"}
    assert {layer.name: layer.precision for layer in built.layers}["attention"] == "FP16"
    assert not program.quantized_tensors(built, layers, "INT8")[0] & {"qkv:0", "attention:0"}


class FlatTuner:
    """Every quantized kernel `quantized` ms, every fp16 one 1 ms, a quantize step `step` ms."""

    def __init__(self, quantized, step):
        self.quantized, self.step = quantized, step
        self.prebuilt, self.timed = [], []

    def prebuild(self, jobs):
        self.prebuilt += [spec for spec, _ in jobs]

    def fastest_ms(self, spec, factory):
        self.timed.append(spec)
        return self.quantized if spec.quant is not None else 1.0

    def op_ms(self, op, *shapes_and_dtypes):
        return self.step


def test_an_attention_block_pays_one_quantize_step_for_its_chain_and_one_for_q_k_and_v(monkeypatch):
    """Projection, attention and projection each gain 0.3 ms quantized, a quantize step costs 0.5: run alone each
    would stay fp16, but the projection's quantized output is the attention's q, k and v (one tensor through a
    view: a single step if it were not written quantized), and the attention's the output projection's operand."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program
    from tftrt_py.engine.backends.cupy.ops import BuildOptions

    attention_kernel_available(monkeypatch)
    monkeypatch.setattr(program, "operand_quantize", lambda *args, **kwargs: None)
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    layers = program.quantized_layers(built, "INT8")
    kept, choice = program.keep_faster_quantized(built, layers, "INT8", FlatTuner(0.7, 0.5), BuildOptions(), {})
    assert set(kept) == {"qkv", "attention", "o"}, choice
    kept, choice = program.keep_faster_quantized(built, layers, "INT8", FlatTuner(0.9, 0.5), BuildOptions(), {})
    assert set(kept) == set(), choice  # 0.5 + 3 x 0.9 against 3 x 1.0


def test_the_specs_each_layer_is_timed_with_are_handed_to_the_tuner_to_build_together_first(monkeypatch):
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program
    from tftrt_py.engine.backends.cupy.ops import BuildOptions

    attention_kernel_available(monkeypatch)
    monkeypatch.setattr(program, "operand_quantize", lambda *args, **kwargs: None)
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    tuner = FlatTuner(0.7, 0.5)
    program.keep_faster_quantized(built, program.quantized_layers(built, "INT8"), "INT8", tuner, BuildOptions(), {})
    assert len(tuner.prebuilt) == 6  # quantized and fp16 for each of qkv, attention and o
    assert [s.signature() for s in tuner.prebuilt] == [s.signature() for s in tuner.timed]


def test_every_quantize_step_is_made_before_the_first_timing(monkeypatch):
    """A step makes its kernel when made: all of them compile with the candidates' before the first timing
    (tactics.Tuner._timer), rather than each alone as it is first timed."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program
    from tftrt_py.engine.backends.cupy.ops import BuildOptions

    attention_kernel_available(monkeypatch)
    events = []
    monkeypatch.setattr(program, "operand_quantize", lambda *args, **kwargs: events.append("step made"))

    class Recording(FlatTuner):
        def fastest_ms(self, spec, factory):
            events.append("timed")
            return super().fastest_ms(spec, factory)

    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    program.keep_faster_quantized(built, program.quantized_layers(built, "INT8"), "INT8", Recording(0.7, 0.5),
                                  BuildOptions(), {})
    assert "step made" in events and "timed" in events
    assert events.index("timed") > max(i for i, e in enumerate(events) if e == "step made")


class KnownTactics:
    """A tuner that holds the tactics of the layers named in `known` (a plan's or the timing cache's)."""

    def __init__(self, known):
        self.known = set(known)
        self.warmed = []

    def knows(self, spec):
        return spec.layer.name in self.known

    def warm(self, specs):
        self.warmed += list(specs)


def test_triton_kernels_are_prefetched_only_for_layers_whose_tactic_is_not_known(monkeypatch):
    """A layer whose quantized tactic the timing cache (or plan) holds builds its one recorded kernel when chosen:
    compiling all of its candidate tiles ahead would only keep a warm build waiting on the compile process."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program
    from tftrt_py.engine.backends.cupy.ops import BuildOptions

    attention_kernel_available(monkeypatch)
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    layers = program.quantized_layers(built, "INT8")
    asked = []
    monkeypatch.setattr(program.triton_conv, "prefetch_requests", lambda layers, count, tiles=None: list(layers))
    monkeypatch.setattr(program.triton, "prefetch", asked.extend)

    def prefetched(known, prefer=None):
        asked.clear()
        program._prefetch_triton_kernels(built, layers, "INT8", prefer or {}, KnownTactics(known), BuildOptions())
        return sorted(geom.cout for _, geom, *_ in asked)

    assert prefetched(set()) == [64, 192]  # the output projection and the QKV projection, as 1x1 convolutions
    assert prefetched({"qkv"}) == [64]
    assert prefetched({"qkv", "o"}) == []
    assert prefetched(set(), prefer={"o": {"int8": True}}) == [192]


class ChosenTactics:
    """A tuner after keep_faster_quantized: the tactic each layer's quantized timing chose."""

    def __init__(self, chosen):
        self.chosen = chosen

    def tactic_of(self, layer_name, quantized):
        return self.chosen.get(layer_name) if quantized else None


@pytest.mark.parametrize("stored, out, scaled, dual", [("fp16", "float16", False, False),
                                                       ("quantized", "int8", True, False),
                                                       ("both", "float16", True, True)])
def test_the_program_kernel_of_each_tile_that_won_is_compiled_ahead_in_the_output_the_plan_stores(
        monkeypatch, stored, out, scaled, dual):
    """A layer timed writing int8 (as if every reader stayed quantized) writes fp16 where a reader then runs in FP16,
    or int8 beside fp16 (a residual's): the tile that won is compiled for that output in threads as soon as the plan
    is known, rather than one kernel after another while the program is laid out; only Triton tactics have one."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program

    attention_kernel_available(monkeypatch)
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    layers = program.quantized_layers(built, "INT8")
    qkv = next(l for l in built.layers if l.name == "qkv").outputs[0].name
    asked, prefetched = [], []
    monkeypatch.setattr(program.triton_conv, "prefetch_requests",
                        lambda jobs, count, tiles=None: asked.extend((job, list(tiles)) for job in jobs) or ["request"])
    monkeypatch.setattr(program.triton, "prefetch", lambda requests, threads=False: prefetched.append((requests,
                                                                                                       threads)))
    plan = program.QuantPlan(layers, {}, {}, {qkv} if stored == "quantized" else set(),
                             {qkv} if stored == "both" else set(), set())
    tuner = ChosenTactics({"qkv": {"op": "triton_gemm_int8", "tile": [128, 64, 128, 4, 4, 1]},
                           "o": {"op": "cublaslt_gemm_int8", "plan": 1}})
    program._prefetch_program_kernels(built, plan, "INT8", tuner)
    ((job, tiles),) = asked
    assert tiles == [(128, 64, 128, 4, 4)] and job[1].cout == 192  # the QKV projection alone
    assert (job[6], job[7] is not None, job[8]) == (out, scaled, dual)
    assert prefetched == [(["request"], True)]


def test_anticipating_a_build_prefetches_the_kernels_of_every_quantized_layer_whose_tactic_is_not_known(monkeypatch):
    """While calibration runs (ranges stand-ins), nothing is preferred yet: every candidate the tuner does not know
    has its tiles compiled; an FP16 build compiles none."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program
    from tftrt_py.engine.backends.cupy.ops import BuildOptions

    attention_kernel_available(monkeypatch)
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    asked = []
    monkeypatch.setattr(program.triton_conv, "prefetch_requests", lambda layers, count, tiles=None: list(layers))
    monkeypatch.setattr(program.triton, "prefetch", asked.extend)
    program.anticipate(built, "INT8", KnownTactics({"qkv"}), BuildOptions())
    assert sorted(geom.cout for _, geom, *_ in asked) == [64]
    asked.clear()
    program.anticipate(built, "FP16", KnownTactics(set()), BuildOptions())
    assert asked == []


def test_anticipating_a_build_warms_the_specs_the_build_will_time_each_quantized_layer_with(monkeypatch):
    """cuDNN plans depend on shapes, not ranges: while calibration runs, the plans of the very specs
    keep_faster_quantized later times (quantized and fp16) are compiled ahead (Tuner.warm)."""
    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends.cupy import quant_planning as program
    from tftrt_py.engine.backends.cupy.ops import BuildOptions

    attention_kernel_available(monkeypatch)
    monkeypatch.setattr(program, "operand_quantize", lambda *args, **kwargs: None)
    monkeypatch.setattr(program.triton, "prefetch", lambda requests: None)
    built = Builder(BuilderConfig(precision="INT8")).build_engine(attention_block_net()).network
    tuner = KnownTactics(set())
    program.anticipate(built, "INT8", tuner, BuildOptions())
    timing = FlatTuner(0.7, 0.5)
    program.keep_faster_quantized(built, program.quantized_layers(built, "INT8"), "INT8", timing, BuildOptions(), {})
    assert sorted(s.signature() for s in tuner.warmed) == sorted(s.signature() for s in timing.timed)
    assert len(tuner.warmed) == 6  # quantized and fp16 for each of qkv, attention and o
