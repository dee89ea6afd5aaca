"""Which quantized layers stay int8 (cupy program.settle_quantized): the precisions of least total time, where an
int8 layer also pays a quantize step for each operand no int8 layer writes, so a chain pays it once."""
import itertools

import numpy as np

from tftrt_py.engine.backends.cupy.program import _Costs, settle_quantized

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
