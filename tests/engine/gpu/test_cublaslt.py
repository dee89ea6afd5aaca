"""cuBLASLt GEMMs (backends/cupy/cublaslt.py): each epilogue, transposes and batches against numpy in float64 on
fresh random operands, outputs poisoned with NaN first, a CUDA-graph replay equal to the eager run; int8
products exact; the FP8 (E4M3) entry point; and engines whose MatrixMultiply, MLP and int8 GEMMs are forced
through cuBLASLt against the numpy backend."""
import logging

import numpy as np
import pytest

from tftrt_py.engine import Engine, Network, Runtime

from gpu_helpers import GPU, compare, cupy_engine, healthy_gpu, normal, single  # noqa: F401 (autouse fixture)

pytestmark = GPU

nvmath = pytest.importorskip("nvmath", reason="cuBLASLt GEMMs need nvmath-python (the carried wheel)")

GELU_C = np.sqrt(2.0 / np.pi)
ACTS = {"DEFAULT": lambda x: x, "BIAS": lambda x: x,
        "GELU": lambda x: 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3))),
        "GELU_BIAS": lambda x: 0.5 * x * (1 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))}
TOL = {"float16": 1e-2, "float32": 1e-4}


def lt_run(plan, a, b, d, algo=0, graph=False):
    """Run `plan` on cupy arrays on a fresh stream, eagerly or as a captured graph (replayed twice), after the work
    that made them (a non-blocking stream does not wait for cupy's default stream by itself: on a busy GPU the
    product could read operands not yet copied)."""
    import cupy

    from tftrt_py.engine.backends.cupy.tactics import capture

    stream = cupy.cuda.Stream(non_blocking=True)
    ws = cupy.empty(max(plan.workspace(algo), 1), cupy.uint8)
    stream.wait_event(cupy.cuda.get_current_stream().record())

    def go():
        plan.run(algo, a.data.ptr, b.data.ptr, d.data.ptr, ws.data.ptr, ws.nbytes, stream.ptr)

    if graph:
        g, keep = capture(stream, go)
        g.launch(stream)
        g.launch(stream)
    else:
        go()
    stream.synchronize()
    return d.get()


def rel_err(got, ref):
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(1.0, np.max(np.abs(ref))))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("epilogue", sorted(ACTS))
def test_epilogues(dtype, epilogue):
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import LtGemm

    rng = np.random.default_rng(len(epilogue))
    m, n, k = 96, 80, 72
    a = rng.standard_normal((m, k)).astype(dtype)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype) if "BIAS" in epilogue else None
    plan = LtGemm(m, n, k, dtype, epilogue=epilogue, bias=cupy.asarray(bias) if bias is not None else None)
    ref = a.astype(np.float64) @ b.astype(np.float64) + (bias.astype(np.float64) if bias is not None else 0)
    ref = ACTS[epilogue](ref)
    eager = lt_run(plan, cupy.asarray(a), cupy.asarray(b), cupy.full((m, n), np.nan, dtype))
    assert np.isfinite(eager).all() and rel_err(eager, ref) < TOL[dtype], (epilogue, rel_err(eager, ref))
    replay = lt_run(plan, cupy.asarray(a), cupy.asarray(b), cupy.full((m, n), np.nan, dtype), graph=True)
    np.testing.assert_array_equal(replay, eager)


def test_plans_of_the_same_gemm_share_one_heuristic_query_and_compute_alike(monkeypatch):
    """A transformer's layers repeat their GEMMs: the heuristics' algorithms are asked for once per GEMM (operand
    addresses aside), and each plan computes with them as a plan asking itself would."""
    import cupy
    from nvmath.bindings import cublasLt as lt

    from tftrt_py.engine.backends.cupy import cublaslt

    monkeypatch.setattr(cublaslt, "_HEURISTICS", {})
    queries = []
    query = lt.matmul_algo_get_heuristic
    monkeypatch.setattr(lt, "matmul_algo_get_heuristic", lambda *args: queries.append(1) or query(*args))
    rng = np.random.default_rng(5)
    m, n, k = 64, 48, 32
    a = rng.standard_normal((m, k)).astype("float16")
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float16")
    biases = [cupy.asarray(rng.standard_normal(n).astype("float16")) for _ in range(3)]
    plans = [cublaslt.LtGemm(m, n, k, "float16", epilogue="BIAS", bias=bias) for bias in biases]
    assert len(queries) == 1 and len({len(p.algos) for p in plans}) == 1
    cublaslt.LtGemm(m, n, 2 * k, "float16", epilogue="BIAS", bias=biases[0])  # another GEMM: its own query
    assert len(queries) == 2
    for plan, bias in zip(plans, biases):
        got = lt_run(plan, cupy.asarray(a), cupy.asarray(b), cupy.full((m, n), np.nan, "float16"))
        ref = a.astype(np.float64) @ b.astype(np.float64) + cupy.asnumpy(bias).astype(np.float64)
        assert rel_err(got, ref) < TOL["float16"]


@pytest.mark.parametrize("epilogue", ["BIAS", "GELU", "GELU_BIAS"])
def test_fused_epilogues_keep_nan(epilogue):
    """A NaN in A makes its output row NaN, as in TF (cuBLASLt's ReLU gives 0 there: it is not fused)."""
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import LtGemm, fused_epilogue

    assert fused_epilogue(True, {"type": "relu"}) is None and fused_epilogue(True, {"type": "gelu_erf"}) is None
    assert fused_epilogue(True, {"type": "relu"}, "float16") is None
    rng = np.random.default_rng(9)
    m, n, k = 32, 48, 64
    a = rng.standard_normal((m, k)).astype(np.float16)
    a[[3, 17], 5] = np.nan
    b = (rng.standard_normal((k, n)) / 8).astype(np.float16)
    bias = cupy.asarray(rng.standard_normal(n).astype(np.float16)) if "BIAS" in epilogue else None
    got = lt_run(LtGemm(m, n, k, "float16", epilogue=epilogue, bias=bias), cupy.asarray(a), cupy.asarray(b),
                 cupy.zeros((m, n), np.float16))
    rows = np.isnan(got).all(axis=1)
    assert rows[[3, 17]].all() and rows.sum() == 2 and not np.isnan(got[~rows]).any()


@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (True, True)])
def test_transposes_and_batches(trans_a, trans_b):
    """Batched products, A broadcast over the batch (stride 0), every algorithm the heuristics gave."""
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import LtGemm

    rng = np.random.default_rng(7)
    batch, m, n, k = 3, 40, 24, 56
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float16)
    b = rng.standard_normal((batch,) + ((n, k) if trans_b else (k, n))).astype(np.float16)
    plan = LtGemm(m, n, k, "float16", trans_a=trans_a, trans_b=trans_b, batch=batch, stride_a=0,
                  stride_b=n * k, algos=3)
    a64 = a.astype(np.float64).T if trans_a else a.astype(np.float64)
    b64 = np.swapaxes(b.astype(np.float64), 1, 2) if trans_b else b.astype(np.float64)
    ref = a64[None] @ b64
    for algo in range(len(plan.algos)):
        got = lt_run(plan, cupy.asarray(a), cupy.asarray(b), cupy.full((batch, m, n), np.nan, np.float16), algo)
        assert rel_err(got, ref) < 1e-2, (algo, rel_err(got, ref))


def test_int8_exact():
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import LtGemm

    rng = np.random.default_rng(3)
    m, n, k, batch = 48, 36, 64, 2
    a = rng.integers(-127, 128, (batch, m, k)).astype(np.int8)
    b = rng.integers(-127, 128, (batch, n, k)).astype(np.int8)
    plan = LtGemm(m, n, k, "int8", out_dtype="int32", trans_b=True, batch=batch, stride_a=m * k, stride_b=n * k)
    ref = np.einsum("bmk,bnk->bmn", a.astype(np.int64), b.astype(np.int64))
    for graph in (False, True):
        d = cupy.full((batch, m, n), -(2 ** 31), np.int32)
        np.testing.assert_array_equal(lt_run(plan, cupy.asarray(a), cupy.asarray(b), d, graph=graph), ref)


def e4m3_values() -> np.ndarray:
    """The float value of each E4M3 byte (0x7f and 0xff are NaN)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value


@pytest.mark.parametrize("out_dtype,with_bias", [("float16", False), ("float16", True), ("float32", False)])
def test_fp8_gemm(out_dtype, with_bias):
    """E4M3 operands with per-tensor scales; Hopper's FP8 accumulation is narrower than fp32 (2e-3 of max)."""
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import fp8_gemm

    major, minor = cupy.cuda.Device().compute_capability[:1], cupy.cuda.Device().compute_capability[1:]
    if int(major) * 10 + int(minor) < 89:
        pytest.skip("FP8 GEMMs need compute capability 8.9 or later")
    rng = np.random.default_rng(5)
    m, n, k = 64, 48, 96
    vals = e4m3_values()
    finite = np.flatnonzero(np.isfinite(vals))
    a = rng.choice(finite, (m, k)).astype(np.uint8)
    b = rng.choice(finite, (n, k)).astype(np.uint8)
    sa, sb = np.float32(0.02), np.float32(0.5)
    bias = rng.standard_normal(n).astype(np.float16) if with_bias else None
    ref = (sa * vals[a]) @ (sb * vals[b]).T + (bias.astype(np.float64) if with_bias else 0)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        args = (cupy.asarray(a), cupy.asarray(b), cupy.asarray([sa]), cupy.asarray([sb]), out_dtype,
                cupy.asarray(bias) if with_bias else None)
        out = fp8_gemm(*args, out=cupy.full((m, n), np.nan, out_dtype), stream=stream).get()
    assert np.isfinite(out).all() and rel_err(out, ref) < 2e-3, rel_err(out, ref)


def test_fp8_gemm_refuses_a_float32_bias():
    import cupy

    from tftrt_py.engine.backends.cupy.cublaslt import fp8_gemm

    a, b = cupy.zeros((16, 16), cupy.uint8), cupy.zeros((16, 16), cupy.uint8)
    one = cupy.ones(1, cupy.float32)
    with pytest.raises(ValueError, match="float16 bias"):
        fp8_gemm(a, b, one, one, "float32", bias=cupy.ones(16, cupy.float32))


# -- engines forced through cuBLASLt -------------------------------------------------------------------------
@pytest.fixture
def lt_only(monkeypatch):
    monkeypatch.setenv("TFTRT_PY_GEMM", "cublaslt")


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
@pytest.mark.parametrize("act", [None, {"type": "relu"}, {"type": "gelu_tanh"}, {"type": "gelu_erf"}],
                         ids=lambda a: (a or {}).get("type", "none"))
def test_matrix_multiply_bias_activation(act, precision, lt_only):
    rng = np.random.default_rng(1)
    w, bias = (rng.standard_normal((64, 48)) / 8).astype(np.float32), rng.standard_normal(48).astype(np.float32)

    def build():
        net = Network("fc")
        x = net.add_input("x0", "float32", (32, 64))
        y = net.add_layer("MatrixMultiply", [x, net.add_constant(w)], {"activation": act} if act else {},
                          {"bias": bias}).outputs[0]
        net.mark_output(y, name="y0")
        return net

    engine = compare(build, normal((32, 64)), precision)
    tactic = next(iter(engine.tactics.values()))
    fused = {None: "BIAS", "relu": "DEFAULT", "gelu_tanh": "GELU_BIAS",
             "gelu_erf": "GELU_BIAS" if precision == "FP16" else "DEFAULT"}  # fp16: the tanh form, see REDUCED_GELU
    assert tactic["op"] == "cublaslt_gemm" and tactic["epilogue"] == fused[(act or {}).get("type")], tactic


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_batched_matrix_multiply(precision, lt_only):
    sa, sb = (2, 3, 17, 24), (2, 3, 19, 24)
    engine = compare(single("MatrixMultiply", [("float32", sa), ("float32", sb)], {"transpose_b": True}),
                     normal(sa, sb), precision)
    assert next(iter(engine.tactics.values()))["op"] == "cublaslt_gemm"


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_mlp(precision, lt_only):
    rng = np.random.default_rng(2)
    weights = {"w0": (rng.standard_normal((32, 64)) / 6).astype(np.float32),
               "b0": rng.standard_normal(64).astype(np.float32),
               "w1": (rng.standard_normal((64, 64)) / 8).astype(np.float32),
               "b1": rng.standard_normal(64).astype(np.float32),
               "w2": (rng.standard_normal((64, 16)) / 8).astype(np.float32),
               "b2": rng.standard_normal(16).astype(np.float32)}
    params = {"activations": [{"type": "gelu_tanh"}, {"type": "gelu_erf"}, None]}
    engine = compare(single("MLP", [("float32", (24, 32))], params, weights), normal((24, 32)), precision)
    tactic = next(iter(engine.tactics.values()))
    erf = "GELU_BIAS" if precision == "FP16" else "DEFAULT"  # fp16 fuses the erf GELU as the tanh form
    assert tactic["op"] == "cublaslt_mlp" and tactic["epilogues"] == ["GELU_BIAS", erf, "BIAS"], tactic
    assert len(tactic["plan"]) == 3, tactic  # an algorithm per GEMM


def ffn(rows=512, hidden=768, inner=3072):
    """A network of a BERT-sized FFN (erf GELU between its GEMMs) as one MLP layer."""
    rng = np.random.default_rng(5)
    weights = {"w0": (rng.standard_normal((hidden, inner)) / np.sqrt(hidden)).astype(np.float32),
               "b0": (rng.standard_normal(inner) / 4).astype(np.float32),
               "w1": (rng.standard_normal((inner, hidden)) / np.sqrt(inner)).astype(np.float32),
               "b1": (rng.standard_normal(hidden) / 4).astype(np.float32)}
    return single("MLP", [("float32", (rows, hidden))], {"activations": [{"type": "gelu_erf"}, None]}, weights)()


def test_fp16_erf_gelu_in_the_tanh_form_is_as_accurate_as_the_erf_pass(monkeypatch):
    """FP16 engines fuse the erf GELU as cuBLASLt's tanh form (cublaslt.REDUCED_GELU); against float64 with the erf
    form, a BERT-sized FFN errs by no more than 1.25x the fp16 engine that computes the erf form in its pass."""
    x = {"x0": np.random.default_rng(6).standard_normal((512, 768)).astype(np.float32)}
    ref = Engine(ffn(), precision="FP32", backend="numpy").create_execution_context().execute(x)["y0"]
    errs = {}
    for path in ("cublaslt", "cublas"):
        monkeypatch.setenv("TFTRT_PY_GEMM", path)
        engine = cupy_engine(ffn(), "FP16")
        got = engine.create_execution_context().execute(x)["y0"]
        errs[path] = float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))
        assert engine.tactics["mlp"]["epilogues" if path == "cublaslt" else "op"] == (
            ["GELU_BIAS", "BIAS"] if path == "cublaslt" else "cublas_mlp"), engine.tactics
    print("relative L2 against float64, erf form:", errs)
    assert errs["cublaslt"] < 1.25 * errs["cublas"] and errs["cublaslt"] < 2e-3, errs


def test_a_plan_recorded_with_the_erf_pass_is_retuned(lt_only, caplog):
    """Plans from before REDUCED_GELU recorded the erf GELU unfused ("DEFAULT"): their algorithm indices belong to
    another epilogue's heuristics, so the layer is re-tuned (logged), not run with a mismatched algorithm."""
    engine = cupy_engine(ffn(rows=64), "FP16")
    old = Runtime().deserialize_cuda_engine(engine.serialize())
    old.tactics["mlp"] = dict(old.tactics["mlp"], epilogues=["DEFAULT", "BIAS"])
    with caplog.at_level(logging.INFO):
        old.create_execution_context()
    assert "re-tuning" in caplog.text and old.tactics["mlp"]["epilogues"] == ["GELU_BIAS", "BIAS"]


@pytest.mark.parametrize("case", ["fc_gelu_pad_k", "attention_scores", "constant_a"])
def test_int8_matrix_multiply(case, lt_only):
    """test_int8's int8 MatrixMultiply cases, their GEMM through cuBLASLt, against the int8 contract."""
    import test_int8

    engine = test_int8.check(*test_int8.matmul_case(case, bias=False, b_range=1.0), case)
    assert engine.tactics["mm"]["op"] == "cublaslt_gemm_int8", engine.tactics


def test_the_backend_loads_its_gemm_and_convolution_libraries_on_a_thread_of_their_own_once_created(monkeypatch):
    import threading

    from tftrt_py.engine.backends.cupy import backend as backend_mod

    warmed, threads = threading.Event(), []
    monkeypatch.setattr(backend_mod.CupyBackend, "warm_up",
                        lambda self: threads.append(threading.current_thread().name) or warmed.set())
    backend_mod.CupyBackend()
    assert warmed.wait(10) and threads == ["tftrt-backend-libraries"]
