"""Triton kernels compiled ahead of time (cupy backend's triton package), without a GPU or Triton: a build's
compile process answers in JSON lines, which are read as data only, and a kernel it does not deliver is compiled
where it is needed; the quantized convolution's tiles and the geometry it runs a stem in (ops/triton_conv.py)."""
import base64
import concurrent.futures
import dataclasses
import io
import json
import logging
import types

import numpy as np
import pytest

from tftrt_py.engine.backends.cupy import helper_processes
from tftrt_py.engine.backends.cupy import triton as kernels
from tftrt_py.engine.backends.cupy.ops import conv_fold, triton_conv
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom

REQUEST = ("some.module", "kernel", (("x", "*i8"),), (("BM", 64),), (), 4, 3, 90)


class FakeProcess:
    """What prefetch reads from: the compile process's stdout."""

    def __init__(self, lines):
        self.stdout = io.BytesIO("".join(line + "\n" for line in lines).encode())

    def wait(self):
        return 0


def answer(index, cubin=b"\x7fELF", name="kernel", warps=4, shared=1024, params=9):
    return json.dumps({"index": index, "artifacts": [base64.b64encode(cubin).decode(), name, warps, shared, params]})


def collect(lines, n=2):
    futures = [concurrent.futures.Future() for _ in range(n)]
    kernels._collect(FakeProcess(lines), futures)
    return futures


def test_answers_become_the_kernels_artifacts():
    first, second = collect([answer(1, shared=2048), answer(0)])
    assert first.result() == (b"\x7fELF", "kernel", 4, 1024, 9)
    assert second.result()[3] == 2048


def test_the_compile_times_the_process_reports_are_logged_with_the_slowest_kernels(caplog):
    timed = [json.dumps({**json.loads(answer(i, name=f"k{i}")), "seconds": s}) for i, s in enumerate((1.5, 9.0, 2.0))]
    with caplog.at_level(logging.DEBUG, logger=kernels.__name__):
        futures = collect(timed, n=3)
    assert all(f.result() for f in futures)
    (message,) = [r.getMessage() for r in caplog.records if "median" in r.getMessage()]
    assert "2.00 s median, 9.00 s at most" in message and "'k1'" in message


def test_a_kernel_that_did_not_compile_reports_why():
    (future,) = collect([json.dumps({"index": 0, "error": "CompilationError: at 3:4"})], n=1)
    with pytest.raises(RuntimeError, match="CompilationError"):
        future.result()


@pytest.mark.parametrize("line", ["not json", json.dumps({"index": 7, "error": "x"}),
                                  json.dumps({"index": 0, "artifacts": ["!!", "k"]}), json.dumps([1, 2])])
def test_an_unreadable_answer_ends_the_collection_and_the_rest_compile_here(line):
    futures = collect([line, answer(1)])
    assert all(f.done() for f in futures)
    assert isinstance(futures[0].exception(), RuntimeError)


def test_a_kernel_the_process_did_not_deliver_is_compiled_here(monkeypatch):
    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("the Triton compile process ended without this kernel"))
    monkeypatch.setitem(kernels._PREFETCHED, REQUEST, failed)
    monkeypatch.setattr(kernels, "artifacts", lambda request: (b"cubin", "kernel", 8, 0, 9))
    kernels._compile.cache_clear()
    try:
        kernel = kernels.compile_kernel(REQUEST)
    finally:
        kernels._compile.cache_clear()
    assert (kernel.cubin, kernel.threads, kernel.params) == (b"cubin", 256, 9)


def test_kernels_prefetched_in_threads_compile_here_and_one_that_fails_compiles_again_where_needed(monkeypatch):
    other = REQUEST[:1] + ("other",) + REQUEST[2:]
    compiled = []

    def artifacts(request):
        compiled.append(request)
        if request == other and compiled.count(other) == 1:
            raise RuntimeError("a compile that fails in the thread")
        return b"cubin", request[1], 4, 0, 9

    monkeypatch.setattr(kernels, "artifacts", artifacts)
    monkeypatch.setattr(kernels, "_PREFETCHED", {})
    monkeypatch.setattr(helper_processes.subprocess, "Popen", None)  # no compile process
    kernels._compile.cache_clear()
    try:
        kernels.prefetch([REQUEST, other, REQUEST], threads=True)
        kernels._PREFETCHED[other].exception(timeout=10)
        assert kernels.compile_kernel(REQUEST).name == "kernel"
        assert kernels.compile_kernel(other).name == "other"
        kernels.prefetch([REQUEST], threads=True)  # already asked for: not compiled again
    finally:
        kernels._compile.cache_clear()
    assert compiled.count(REQUEST) == 1 and compiled.count(other) == 2


class CompileProcess:
    """A compile process started ahead: what it was given, whether it was polled alive."""

    def __init__(self):
        self.given = None
        self.stdin = self
        self.stdout = io.BytesIO()

    def poll(self):
        return None

    def write(self, data):
        self.given = data

    def close(self):
        self.given = self.given or b""

    def wait(self):
        return 0


@pytest.mark.parametrize("requests", [[REQUEST], []])
def test_the_compile_process_started_ahead_serves_the_first_prefetch_or_ends(monkeypatch, requests):
    ahead = CompileProcess()
    monkeypatch.setattr(kernels, "_PREFETCHED", {})
    waiting = {kernels.COMPILE_WORKER: [(ahead, helper_processes.time.monotonic())]}
    monkeypatch.setattr(helper_processes, "_waiting", waiting)
    monkeypatch.setattr(helper_processes.subprocess, "Popen", None)  # no other process starts
    kernels.prefetch(requests)
    assert ahead.given == (json.dumps(requests).encode() if requests else b"")
    assert kernels.COMPILE_WORKER not in helper_processes._waiting


def test_requests_are_hashable_and_order_independent():
    a = kernels.request("m", "f", {"x": "*i8", "n": "i32"}, {"B": 1, "A": 2}, 90, ("n",), 4, 3)
    b = kernels.request("m", "f", {"n": "i32", "x": "*i8"}, {"A": 2, "B": 1}, 90, ["n"], 4, 3)
    assert a == b and hash(a) == hash(b)
    assert json.loads(json.dumps(a))[2] == [["n", "i32"], ["x", "*i8"]]  # what the compile process receives


def geom(c, kernel=(3, 3)):
    pad = kernel[0] // 2
    return ConvGeom(8, (14, 14), c, 64, kernel, 1, (1, 1), (1, 1), (pad, pad), (pad, pad), (14, 14))


@pytest.mark.parametrize("c, kernel, bk, small_c", [(256, (3, 3), 128, 0), (128, (1, 1), 128, 0),
                                                    (64, (3, 3), 64, 0), (96, (3, 3), 32, 0), (4, (7, 7), 128, 4)])
def test_a_step_reads_the_tiles_bk_bytes_where_they_divide_the_channels_or_a_stems_whole_taps(c, kernel, bk, small_c):
    tile = (128, 128, 128, 4, 3)
    assert triton_conv.kernel_tile(geom(c, kernel), tile) == (128, 128, bk, 4, 3)
    request = triton_conv.kernel_request("INT8", geom(c, kernel), True, {"type": "relu"}, None, False, "int8", False,
                                         tile, 90)
    constexprs = dict(request[3])
    assert (constexprs["BK"], constexprs["SMALL_C"]) == (bk, small_c) and request[5:7] == (4, 3)


def resnet_conv(batch, hw, c, cout, kernel=(1, 1)):
    """A stride-1 convolution of ResNet-50's shape: `batch` images of hw x hw pixels, c -> cout channels."""
    pad = kernel[0] // 2
    return ConvGeom(batch, (hw, hw), c, cout, kernel, 1, (1, 1), (1, 1), (pad, pad), (pad, pad), (hw, hw))


def test_every_size_class_ranks_every_tile_once():
    for order in triton_conv.TILE_ORDERS.values():
        assert sorted(order) == sorted(triton_conv.TILES)


@pytest.mark.parametrize("conv, size", [
    (resnet_conv(128, 56, 64, 64, (3, 3)), "narrow"),   # 64 output channels: BN 64 tiles first
    (resnet_conv(1, 7, 512, 2048), "small"),            # 49 rows: a fraction of one wave of 128x128 tiles
    (resnet_conv(8, 28, 128, 512), "medium"),           # 49 x 4 tiles: 1.5 waves on 132 SMs
    (resnet_conv(128, 28, 128, 512), "large"),          # 784 x 4 tiles: 24 waves
])
def test_a_convolution_is_timed_with_the_first_tiles_of_its_size_class(conv, size):
    assert triton_conv.size_class(conv, 132) == size
    assert triton_conv.conv_tiles(conv, 132, 3) == tuple(triton_conv.kernel_tile(conv, t)
                                                         for t in triton_conv.TILE_ORDERS[size][:3])


def test_tiles_that_compile_to_one_kernel_count_once_and_a_count_of_eight_is_every_tile():
    conv = resnet_conv(128, 56, 64, 64, (3, 3))  # 64 channels: a BK of 128 steps through 64 of them
    tiles = triton_conv.conv_tiles(conv, 132, 3)
    assert len(set(tiles)) == 3 and all(t[2] == 64 for t in tiles)
    every = {triton_conv.kernel_tile(conv, t) for t in triton_conv.TILES}
    assert set(triton_conv.conv_tiles(conv, 132, 8)) == every and len(every) < 8


def test_the_kernels_compiled_ahead_are_those_the_build_times(monkeypatch):
    """prefetch_requests asks for the conv_tiles of each convolution on this GPU (its SM count), in the geometry the
    kernel runs it in; given tiles (a MatrixMultiply's, a recorded one) are asked for as they are."""
    fake_gpu(monkeypatch)
    conv = resnet_conv(8, 28, 128, 512)
    job = ("INT8", conv, True, {"type": "relu"}, None, False, "int8", 0.05, False)
    asked = [dict(r[3]) for r in triton_conv.prefetch_requests([job], 3)]
    assert [(c["BM"], c["BN"], c["BK"]) for c in asked] == [t[:3] for t in triton_conv.conv_tiles(conv, 132, 3)]
    given = triton_conv.prefetch_requests([job], 3, [(64, 64, 64, 4, 3)])
    assert [(dict(r[3])["BM"], r[5], r[6]) for r in given] == [(64, 4, 3)]


def test_a_build_without_quantized_convolutions_does_not_import_triton(monkeypatch):
    """Nothing to compile (an FP16 build's prefetch): no request, and Triton (about 0.2 s to import) is not asked
    whether it is there."""
    def imported():
        raise AssertionError("Triton was imported")

    monkeypatch.setattr(triton_conv.triton, "available", imported)
    assert triton_conv.prefetch_requests([], 3) == []


def fake_gpu(monkeypatch, sms=132):
    """triton_conv on a fake GPU of `sms` SMs whose every kernel compiles (to a stand-in)."""
    device = types.SimpleNamespace(compute_capability="90", attributes={"MultiProcessorCount": sms})
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: device))
    monkeypatch.setattr(triton_conv.triton, "available", lambda: True)
    monkeypatch.setattr(triton_conv._device, "require", lambda: cupy)
    monkeypatch.setattr(triton_conv.triton, "compile_kernel", lambda request: ("kernel", request))


DEQ = types.SimpleNamespace(bias=None, activation={"type": "relu"}, res_scale=None, out_dtype="int8",
                            dual_scale=None, requant_scale=0.05, nbytes=0)


def test_grids_that_launch_a_program_a_tile_are_timed_once(monkeypatch):
    """A persistent grid of 1, 2 or 4 programs an SM launches as many programs as a small layer has tiles, as grid 0
    does: the same launch, timed once; a large layer keeps each grid."""
    fake_gpu(monkeypatch)
    w = np.zeros(1, np.int8)
    small = triton_conv.triton_conv_candidates("INT8", resnet_conv(1, 7, 512, 2048), w, DEQ, None, {}, 3)
    assert len(small) == 3 and all(op.tactic["tile"][5] == 0 for op in small)
    large = triton_conv.triton_conv_candidates("INT8", resnet_conv(128, 28, 128, 512), w, DEQ, None, {}, 3)
    assert len(large) == 3 * len(triton_conv.GRIDS)
    assert len({(tuple(op.tactic["tile"][:5]), op.grid) for op in large}) == len(large)


@pytest.mark.parametrize("change, fits", [({}, True), ({"pre": (0, 0), "post": (1, 1)}, True),  # TF's SAME
                                          ({"groups": 2}, False), ({"dilations": (2, 2)}, False),
                                          ({"c": 48}, False), ({"c": 6}, False)])
def test_the_kernel_takes_2d_ungrouped_undilated_convolutions_padded_before_and_after_alike_or_not(change, fits):
    conv = dataclasses.replace(geom(64), strides=(2, 2), out=(7, 7), **change)
    assert triton_conv.fits(conv, {"type": "relu"}, None) == fits
    assert not triton_conv.fits(conv, {"type": "sigmoid"}, None)


@pytest.mark.parametrize("activation, code", [(None, 0), ({"type": "relu"}, 1), ({"type": "gelu_tanh"}, 2),
                                              ({"type": "gelu_erf"}, 2)])
def test_the_epilogue_applies_relu_and_gelu_the_erf_form_as_fp16_engines_in_the_tanh_form(activation, code):
    assert triton_conv.fits(geom(64), activation, None)
    request = triton_conv.kernel_request("FP8", geom(64), False, activation, None, False, "float16", False,
                                         triton_conv.TILES[0], 90)
    assert dict(request[3])["ACT"] == code


@pytest.mark.parametrize("fmt, out, scale, clamp16", [("INT8", "int8", 0.05, True), ("INT8", "int8", 1e-7, False),
                                                       ("INT8", "int8", 600.0, False), ("INT8", "float16", 0.05, False),
                                                       ("FP8", "uint8", 0.05, False)])
def test_int8_outputs_are_clamped_in_fp16_where_127_times_their_scale_is_a_normal_fp16_value(fmt, out, scale, clamp16):
    request = triton_conv.kernel_request(fmt, geom(64), True, None, None, False, out, False, triton_conv.TILES[0], 90,
                                         scale if out != "float16" else None)
    assert dict(request[3])["CLAMP16"] == clamp16


def gemm_operands(a_shape, b_shape, params=None, b_constant=True):
    """triton_conv.gemm_operands of an INT8 MatrixMultiply (program.quant_plan's quant)."""
    from tftrt_py.engine import Network
    from tftrt_py.engine.backends.cupy.quant_planning import quant_plan

    rng = np.random.default_rng(0)
    net = Network("m")
    a = net.add_input("a", "float16", a_shape)
    b = (net.add_constant(rng.standard_normal(b_shape).astype(np.float32), name="w") if b_constant
         else net.add_input("b", "float16", b_shape))
    a.dynamic_range = b.dynamic_range = 2.0
    layer = net.add_layer("MatrixMultiply", [a, b], params or {}, name="mm")
    return triton_conv.gemm_operands(quant_plan(layer, "INT8")[1], layer.params, layer.outputs[0].shape)


def test_a_quantized_matrix_multiply_by_constant_weights_runs_as_a_1x1_convolution_over_all_rows():
    rows, kp, n, w = gemm_operands((4, 32, 768), (768, 2304))
    assert (rows, kp, n, w.shape, w.dtype) == (128, 768, 2304, (2304, 768), np.int8)
    g = triton_conv.gemm_geom(rows, kp, n)
    assert g.pointwise_gemm() and g.rows == 128 and triton_conv.fits(g, {"type": "gelu_erf"}, None)


@pytest.mark.parametrize("a_shape, b_shape, params, b_constant", [
    ((768, 64), (768, 64), {"transpose_a": True}, True),  # A stored [K, M]
    ((4, 64, 32), (4, 32, 64), {}, False),  # two activations (attention's products)
    ((64, 32), (2, 32, 64), {}, True),  # per-batch weights
])
def test_other_products_keep_the_library_gemms(a_shape, b_shape, params, b_constant):
    assert gemm_operands(a_shape, b_shape, params, b_constant) is None


def test_an_int8_stride_2_image_of_4_channels_the_quantize_step_did_not_fold_runs_as_pairs_of_pixels():
    geom = ConvGeom(2, (12, 20), 4, 5, (7, 7), 1, (2, 2), (1, 1), (3, 3), (3, 3), (6, 10))
    paired = triton_conv.pixel_pairs("INT8", geom)  # the same sums: tests/engine/test_conv_fold.py
    assert paired == conv_fold.fold(geom, conv_fold.WIDTH)
    assert paired.spatial == (12, 10) and paired.c == 8 and paired.strides == (2, 1) and paired.kernel == (7, 4)


@pytest.mark.parametrize("fmt, spatial, c, strides", [("FP8", (12, 20), 4, (2, 2)), ("INT8", (12, 21), 4, (2, 2)),
                                                      ("INT8", (12, 20), 64, (2, 2)), ("INT8", (12, 20), 4, (1, 1))])
def test_other_convolutions_keep_their_geometry(fmt, spatial, c, strides):
    geom = ConvGeom(2, spatial, c, 8, (3, 3), 1, strides, (1, 1), (1, 1), (1, 1), (6, 10))
    assert triton_conv.pixel_pairs(fmt, geom) is geom


def test_an_fp16_convolution_compiles_with_fp16_operands_summed_in_fp32_and_a_float_epilogue():
    request = triton_conv.kernel_request("FP16", geom(64), True, {"type": "relu"}, (8, "float16"), False, "float16",
                                         False, triton_conv.TILES[0], 90)
    params, constexprs = dict(request[2]), dict(request[3])
    assert params["x"] == params["w"] == params["res"] == params["y"] == "*fp16"
    assert constexprs["FP8"] and (constexprs["RES"], constexprs["OUT"], constexprs["SMALL_SUMS"]) == (1, 0, False)


def fp16_spec(c=64, in_dtype="float16", prefer=None):
    conv = geom(c)
    layer = types.SimpleNamespace(params={"activation": {"type": "relu"}},
                                  weights={"kernel": np.zeros((3, 3, c, 64), np.float32)})
    shape = (conv.n, *conv.spatial, c)
    spec = types.SimpleNamespace(layer=layer, prefer=prefer, in_shapes=[shape], in_dtypes=[in_dtype],
                                 out_dtypes=["float16"], options=types.SimpleNamespace(triton_tiles=3))
    return spec, conv


@pytest.mark.parametrize("spec, offered", [(fp16_spec(), True), (fp16_spec(16), False),
                                           (fp16_spec(in_dtype="float32"), False),
                                           (fp16_spec(prefer={"op": "cudnn_conv"}), False)])
def test_fp16_convolutions_of_32_channels_or_more_are_offered_to_our_kernel_unless_a_plan_chose_another(
        monkeypatch, spec, offered):
    fake_gpu(monkeypatch)
    fake = triton_conv._device.require()
    fake.asarray, fake.ones = np.asarray, np.ones
    ops = triton_conv.fp16_conv_candidates(*spec)
    assert bool(ops) == offered
    assert all(op.tactic["op"] == "triton_conv_fp16" and op.tactic["tile"][2] <= 64 for op in ops)
