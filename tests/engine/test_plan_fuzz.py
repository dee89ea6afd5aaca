"""Fuzzing the plan loader: damaged plans raise PlanError quickly, never another error, a crash or a hang.

Byte-level damage (truncation, bit flips, overwrites, garbage) must fail the framing or checksum
checks; header-level damage with a recomputed checksum must fail the header checks or load an
engine that runs (or fails with an EngineError). A watchdog (faulthandler) ends the process with
a traceback if a case hangs.
"""
import faulthandler
import hashlib
import json
import time

import numpy as np
import pytest

from tftrt_py.engine import Builder, EngineError, Network, PlanError, Runtime
from tftrt_py.engine import plan as plan_lib

CASES = 300  # per kind of damage
CASE_SECONDS = 1.0  # each case must finish within this
WATCHDOG_SECONDS = 120


def mixed_net():
    """Convolution (weights), pooling, reshape, matmul (weights) and softmax: several weight blobs."""
    rng = np.random.default_rng(0)
    net = Network("fuzz")
    x = net.add_input("TensorRTInputPH_0", "float32", (2, 6, 6, 3))
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
                                                  post_padding=[1, 1], groups=1, activation={"type": "relu"}),
                         {"kernel": rng.standard_normal((3, 3, 3, 4)).astype("float32"),
                          "bias": rng.standard_normal(4).astype("float32")}, name="conv")
    pool = net.add_layer("Pooling", conv.outputs, dict(type="max", window=[2, 2], strides=[2, 2],
                                                       pre_padding=[0, 0], post_padding=[0, 0]), name="pool")
    mean = net.add_layer("Reduce", pool.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    w = net.add_constant(rng.standard_normal((4, 5)).astype("float32"), name="w")
    mm = net.add_layer("MatrixMultiply", [mean.outputs[0], w], dict(transpose_a=False, transpose_b=False),
                       name="fc")
    soft = net.add_layer("Softmax", mm.outputs, dict(axis=-1), name="softmax")
    net.mark_output(soft.outputs[0], name="TensorRTOutputPH_0")
    return net


@pytest.fixture(scope="module")
def plan():
    return Builder().build_engine(mixed_net()).serialize()


@pytest.fixture(scope="module", autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def split(data):
    """(header dict, weight blob bytes) of a valid plan."""
    header = plan_lib.read_header(data)
    start = header.pop("_blob_start")
    return header, data[start:-32]


def assemble(head: bytes, blobs: bytes) -> bytes:
    """A well-framed plan around raw header bytes, with a correct checksum."""
    body = plan_lib._PREFIX.pack(plan_lib.MAGIC, plan_lib.FORMAT_VERSION, len(head)) + head
    body += b"\0" * plan_lib._pad(len(body)) + blobs
    return body + hashlib.sha256(body).digest()


def with_header(data, edit) -> bytes:
    header, blobs = split(data)
    edit(header)
    return assemble(json.dumps(header).encode(), blobs)


def load(data):
    """Load `data` under the time bound: the engine, or the PlanError raised."""
    start = time.perf_counter()
    try:
        result = Runtime().deserialize_cuda_engine(data)
    except PlanError as exc:
        assert str(exc), "a PlanError must say what is wrong"
        result = exc
    elapsed = time.perf_counter() - start
    assert elapsed < CASE_SECONDS, f"loading took {elapsed:.2f} s"
    return result


def run_loaded(engine):
    """A plan that loads must run, or fail with an EngineError."""
    x = np.random.default_rng(0).standard_normal((2, 6, 6, 3)).astype("float32")
    try:
        engine.create_execution_context().execute({"TensorRTInputPH_0": x})
    except EngineError:
        pass


def assert_rejected(data, original):
    result = load(data)
    if data == original:
        assert not isinstance(result, PlanError), result
    else:
        assert isinstance(result, PlanError), "a damaged plan loaded"


def test_truncation_anywhere(plan):
    rng = np.random.default_rng(1)
    for cut in list(rng.integers(0, len(plan), CASES)) + [0, 1, 19, 20, len(plan) - 32, len(plan) - 1]:
        assert_rejected(plan[:cut], plan)


def test_bit_flips(plan):
    rng = np.random.default_rng(2)
    for _ in range(CASES):
        data = bytearray(plan)
        for pos in rng.integers(0, len(plan), rng.integers(1, 9)):
            data[pos] ^= 1 << int(rng.integers(0, 8))
        assert_rejected(bytes(data), plan)


def test_byte_overwrites(plan):
    rng = np.random.default_rng(3)
    for _ in range(CASES):
        data = bytearray(plan)
        start = int(rng.integers(0, len(plan)))
        span = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
        data[start:start + len(span)] = span
        assert_rejected(bytes(data[:len(plan)]), plan)


def test_random_garbage(plan):
    rng = np.random.default_rng(4)
    prefix = plan[:20]  # magic, version, header length
    for i in range(CASES):
        garbage = rng.integers(0, 256, int(rng.integers(0, 4096)), dtype=np.uint8).tobytes()
        if i % 3 == 1:
            garbage = prefix + garbage
        elif i % 3 == 2:  # valid framing and checksum around garbage
            garbage = assemble(garbage[: len(garbage) // 2], garbage[len(garbage) // 2:])
        assert_rejected(garbage, plan)


WEIRD = [None, True, 0, -1, -64, 64, 1.5, float("nan"), float("inf"), 2 ** 31, 2 ** 63, 2 ** 64 + 1, "", "x",
         "float64", "relu", "x" * 1000, [], {}, [1], [-1, 3], [2 ** 40, 2 ** 40], [0.5], ["a"], {"a": 1},
         [[[[]]]], list(range(1000))]


def leaves(value, path=()):
    """Every path into a JSON value (containers and leaves)."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, path + (i,))


def set_path(header, path, value):
    for key in path[:-1]:
        header = header[key]
    header[path[-1]] = value


def test_header_fields_with_fixed_checksum(plan):
    """A random header field set to a random value; the checksum is recomputed so only the header checks remain."""
    rng = np.random.default_rng(5)
    header, _ = split(plan)
    paths = [p for p in leaves(header) if p]
    loaded = 0
    for _ in range(CASES * 3):
        path = paths[int(rng.integers(0, len(paths)))]
        value = WEIRD[int(rng.integers(0, len(WEIRD)))]
        result = load(with_header(plan, lambda h: set_path(h, path, value)))
        if not isinstance(result, PlanError):
            loaded += 1
            run_loaded(result)
    assert loaded < CASES * 3 // 2  # most of these must be caught


def test_header_text_damage_with_fixed_checksum(plan):
    """Random bytes of the JSON text changed (often still JSON); the checksum is recomputed."""
    rng = np.random.default_rng(6)
    header, blobs = split(plan)
    text = json.dumps(header).encode()
    for _ in range(CASES):
        data = bytearray(text)
        for pos in rng.integers(0, len(text), rng.integers(1, 4)):
            data[pos] = int(rng.choice(list(b'0123456789-.,:[]{}"eE ax')))
        result = load(assemble(bytes(data), blobs))
        if not isinstance(result, PlanError):
            run_loaded(result)


@pytest.mark.parametrize("edit, match", [
    (lambda h: h["layers"][0]["weights"]["kernel"].update(offset=-64), r"weights\['kernel'\]\.offset is -64"),
    (lambda h: h["layers"][0]["weights"]["kernel"].update(offset=1 << 40), r"outside the weight data"),
    (lambda h: h["layers"][0]["weights"]["kernel"].update(nbytes=4), r"nbytes is 4, but a float32 array"),
    (lambda h: h["layers"][0]["weights"]["kernel"].update(dtype="object"), r"dtype is \"object\""),
    (lambda h: h["inputs"][0].update(shape=[2 ** 40, 6, 6, 3]), r"inputs\[0\]\.shape .* exceeds the limit"),
    (lambda h: h["inputs"][0].update(shape=[-2, 6, 6, 3]), r"inputs\[0\]\.shape\[0\] is -2"),
    (lambda h: h["layers"][0]["outputs"][0].update(shape=[2, 6, 6, 5]), r"memory_bytes is \d+, but .* take"),
    (lambda h: (h["layers"][0]["outputs"][0].update(shape=[2, 6, 6, 5]),
                h.update(memory_bytes=h["memory_bytes"] + 2 * 6 * 6 * 4)), r"records outputs .* give"),
    (lambda h: h["inputs"][0].update(dynamic_range=float("nan")), r"dynamic_range is NaN, expected a finite"),
    (lambda h: h["layers"][0].update(kind="Pickle"), r"unknown layer kind 'Pickle'"),
    (lambda h: h["layers"][1].update(inputs=["nowhere"]), r"reads \['nowhere'\]"),
    (lambda h: h.update(outputs=["nowhere"]), r"outputs \['nowhere'\] are not produced"),
    (lambda h: h["layers"][0]["params"].update(strides=[0, 0]),
     r"param strides\[0\] is 0, expected an integer in \[1, "),
    (lambda h: h.update(layers={"a": 1}), r"field layers is \{\}|field layers is dict"),
    (lambda h: h.pop("precision"), r"field precision is null"),
    (lambda h: h.update(blob_bytes="64"), r"field blob_bytes is \"64\""),
])
def test_named_header_errors(plan, edit, match):
    with pytest.raises(PlanError, match=match):
        Runtime().deserialize_cuda_engine(with_header(plan, edit))


@pytest.mark.parametrize("head, match", [
    (b"[1, 2]", "JSON list, expected an object"),
    (b"[" * 100000 + b"]" * 100000, "not valid JSON: RecursionError"),
    (b'{"blob_bytes": ' + b"9" * 5000 + b"}", "not valid JSON: ValueError"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_header_json_errors(plan, head, match):
    _, blobs = split(plan)
    with pytest.raises(PlanError, match=match):
        Runtime().deserialize_cuda_engine(assemble(head, blobs))


def test_header_length_past_the_end(plan):
    body = bytearray(plan[:-32])
    body[12:20] = (len(plan) * 2).to_bytes(8, "little")
    with pytest.raises(PlanError, match="runs past the end"):
        Runtime().deserialize_cuda_engine(bytes(body) + hashlib.sha256(bytes(body)).digest())


def test_undamaged_plan_still_loads(plan):
    engine = load(plan)
    assert not isinstance(engine, PlanError)
    run_loaded(engine)
