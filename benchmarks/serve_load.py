"""Load on tftrt-serve, batching off and on: throughput and latency at N concurrent clients, loopback only.

    python benchmarks/serve_load.py [--model small_cnn|thin_224|resnet50] [--api rest|grpc|kserve-rest|kserve-grpc]
                                    [--clients 32] [--generator python|c] [--frontend-workers N]
                                    [--requests 3000] [--time-limit 60] [--repeat 3] [--json out.json]
                                    [--workdir DIR]

The model (random weights, nothing downloaded) is exported and converted into a temporary folder: the demo CNN in
FP32, `--model resnet50` (Keras ResNet50, 224x224) in FP16 where a GPU serves engines (else FP32), `--model
thin_224` (ResNet-50's 600 KB requests through a cheap net: the server's per-byte cost), engines built
for batch 1 and every allowed batch size. A server (tftrt-serve in this process, or `--server subprocess`) serves
it on ephemeral loopback ports, once without batching and once with TF Serving's batching parameters
(--max-batch-size, --batch-timeout-micros, --num-batch-threads, --allowed-batch-sizes). --clients closed-loop
clients, one connection each, send `--rows`-row predicts (TF Serving's Predict over `--api` rest or grpc, or KServe
v2's infer: kserve-rest with binary tensors, kserve-grpc) until the request count or the time limit is reached,
after a warm-up: Python clients (threads in --client-procs processes), or with `--generator c` C processes
(benchmarks/loadgen/loadgen.c, compiled on first use; one unless --client-procs says more) that spend a few
microseconds of CPU per request. Printed
per mode and run: requests answered, throughput (req/s, rows/s), p50/p99 latency, mean batch size (the server's
metrics), CPU time per request of the server (with `--frontend-workers N`, of its N front-end worker processes
too) and of the clients, the load average (the machine may be shared);
native-segment runs are flagged. Then
the medians of the repeats, the on/off throughput ratio, and the p99 bound 2 x batch_timeout + one full batch's
compute.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import NamedTuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, os.path.join(ROOT, "models")]

import numpy as np  # noqa: E402

MODEL_NAME = "m"


def _thin_224():
    """ResNet-50's requests (224x224x3 float32: 600 KB) through a cheap net (global average pooling and a
    classifier): what the server spends per byte, without ResNet's compute."""
    import keras

    inputs = keras.Input((224, 224, 3), name="image")
    pooled = keras.layers.GlobalAveragePooling2D()(inputs)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(pooled))


def _builders():
    from sample_models import build_keras_application, build_small_cnn

    return {"small_cnn": lambda: build_small_cnn()[0], "thin_224": _thin_224,
            "resnet50": lambda: build_keras_application("resnet50", size=224)[0]}


#: input image size of each model
SIZES = {"small_cnn": 32, "thin_224": 224, "resnet50": 224}


# -- the model ----------------------------------------------------------------------------------------------------
def _gpu() -> bool:
    from tftrt_py.engine.backends import cupy

    return cupy.available()[0]


def convert(model: str, root: str, batches) -> str:
    """The converted model in TF Serving's layout under `root`, with TF Serving's warm-up requests (see
    write_warmup_requests); its precision. A conversion of the same model for the same batches already there (its
    ``converted.json``) is reused."""
    import keras

    from tftrt_py import trt_convert as trt

    marker = os.path.join(root, "converted.json")
    wanted = {"model": model, "batches": list(batches), "gpu": _gpu(), "warmup": True}
    if os.path.exists(marker):
        with open(marker) as f:
            found = json.load(f)
        if {k: found.get(k) for k in wanted} == wanted and os.path.isdir(os.path.join(root, MODEL_NAME, "1")):
            return str(found["precision"])
    for stale in (MODEL_NAME, "native"):
        shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
    size = SIZES[model]
    keras.utils.set_random_seed(0)
    native = _builders()[model]()
    native.export(os.path.join(root, "native"), verbose=False)
    precision = "FP16" if model == "resnet50" and _gpu() else "FP32"
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=os.path.join(root, "native"), precision_mode=precision,
                                        maximum_cached_engines=len(batches))
    converter.convert()
    rng = np.random.default_rng(0)
    converter.build(input_fn=lambda: iter([(rng.standard_normal((b, size, size, 3), np.float32),) for b in batches]))
    converter.save(os.path.join(root, MODEL_NAME, "1"), overwrite=True)
    write_warmup_requests(os.path.join(root, MODEL_NAME, "1"), max(batches), size)
    with open(marker, "w") as f:
        json.dump({**wanted, "precision": precision}, f)
    return precision


def write_warmup_requests(version_dir: str, max_batch: int, size: int) -> None:
    """TF Serving's warm-up file in `version_dir`: a predict request of random images for each power of two up to
    `max_batch` and `max_batch` itself, the batches of the engine copies (engine_op.buckets) a server batching up
    to `max_batch` runs on, so a server loading the version builds them before it serves
    (docs/serving.md#model-warm-up)."""
    import tensorflow as tf
    from tensorflow.python.saved_model import loader_impl
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    graph = loader_impl.parse_saved_model(version_dir).meta_graphs[0]
    (name, _), = graph.signature_def["serving_default"].inputs.items()
    sizes = sorted({1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch})
    path = os.path.join(version_dir, "assets.extra", "tf_serving_warmup_requests")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.default_rng(2)
    with tf.io.TFRecordWriter(path) as writer:
        for batch in sizes:
            request = predict_pb2.PredictRequest()
            request.inputs[name].CopyFrom(tf.make_tensor_proto(rng.standard_normal((batch, size, size, 3),
                                                                                   np.float32)))
            writer.write(prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString())


def batch_compute_ms(path: str, batch: int, size: int, runs: int = 10) -> float:
    """Median time of one `batch`-row call of the converted signature in this process."""
    import tensorflow as tf

    import tftrt_py.trt_convert  # noqa: F401  registers TRTEngineOp

    signature = tf.saved_model.load(path).signatures["serving_default"]
    x = tf.constant(np.random.default_rng(1).standard_normal((batch, size, size, 3), np.float32))
    signature(x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        signature(x)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


# -- the server ---------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _children(pid: int):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(c) for c in f.read().split()]


class InProcess:
    """tftrt-serve's Server in this process (and its front-end worker processes)."""

    def __init__(self, base_path: str, batching, frontend_workers: int = 0):
        from tftrt_py.serving import ModelSpec, Server

        self.server = Server([ModelSpec(MODEL_NAME, base_path)], batching=batching,
                             frontend_workers=frontend_workers).start()
        self.rest_port, self.grpc_port = self.server.rest_port, self.server.grpc_port

    def cpu_seconds(self) -> float:
        """This process's (the server's threads: the clients run elsewhere) and its front-end workers'."""
        workers = self.server.workers.pids() if self.server.workers is not None else []
        return time.process_time() + sum(_cpu_seconds(pid) for pid in workers)

    def stop(self):
        self.server.stop()


class Subprocess:
    """The tftrt-serve command on free loopback ports (its batching parameters in a text-proto file)."""

    def __init__(self, base_path: str, batching, frontend_workers: int = 0):
        self.rest_port, self.grpc_port = _free_port(), _free_port()
        command = [sys.executable, "-m", "tftrt_py.serving.cli", f"--port={self.grpc_port}",
                   f"--rest_api_port={self.rest_port}", "--host=127.0.0.1", f"--model_name={MODEL_NAME}",
                   f"--model_base_path={base_path}", f"--frontend_workers={frontend_workers}"]
        if batching is not None:
            path = os.path.join(os.path.dirname(base_path), "batching.config")
            with open(path, "w") as f:
                f.write(f"max_batch_size {{ value: {batching.max_batch_size} }}\n"
                        f"batch_timeout_micros {{ value: {batching.batch_timeout_micros} }}\n"
                        f"max_enqueued_batches {{ value: {batching.max_enqueued_batches} }}\n"
                        f"num_batch_threads {{ value: {batching.num_batch_threads} }}\n"
                        + "".join(f"allowed_batch_sizes: {b}\n" for b in batching.allowed_batch_sizes))
            command += ["--enable_batching", f"--batching_parameters_file={path}"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()  # "tftrt-serve: serving ..." once loaded, or EOF on failure
        if "serving" not in line:
            self.process.kill()
            raise RuntimeError(f"tftrt-serve did not start: {line!r}")

    def cpu_seconds(self) -> float:
        """The tftrt-serve process's and its front-end workers'."""
        pid = self.process.pid
        return _cpu_seconds(pid) + sum(_cpu_seconds(child) for child in _children(pid))

    def stop(self):
        """SIGTERM, then SIGKILL for it and its workers after 30 s (said on stderr, not raised: a stop in a
        `finally` must not hide the error that ended the run)."""
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            children = _children(self.process.pid)
            print(f"tftrt-serve (pid {self.process.pid}) still running 30 s after SIGTERM: killed with its "
                  f"{len(children)} worker(s)", file=sys.stderr, flush=True)
            for pid in children:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.process.kill()
            self.process.wait()


SERVERS = {"inprocess": InProcess, "subprocess": Subprocess}


def scrape(rest_port: int) -> dict:
    """The server's counters: batches run and their rows, native-segment fallbacks of the engine ops."""
    import re

    with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/monitoring/prometheus/metrics", timeout=30) as r:
        text = r.read().decode()

    def value(name):
        found = re.search(rf'^{name}\{{model="{MODEL_NAME}"\}} (\S+)', text, re.M)
        return float(found.group(1)) if found else 0.0

    fallbacks = sum(float(v) for v in re.findall(r"^tftrt_engine_op_fallback_total\{[^}]*\} (\S+)", text, re.M))
    return {"batches": value("tftrt_serving_batch_size_count"), "rows": value("tftrt_serving_batch_size_sum"),
            "fallbacks": fallbacks}


# -- the requests --------------------------------------------------------------------------------------------------
class Request(NamedTuple):
    """What a client sends again and again: a gRPC method and its serialized message, or an HTTP POST."""
    grpc: bool
    path: str
    body: bytes
    headers: dict


def _rest_request(model: str, input_name: str, x: np.ndarray) -> Request:
    body = json.dumps({"instances": [{input_name: row} for row in x.tolist()]}).encode()
    return Request(False, f"/v1/models/{model}:predict", body, {"Content-Type": "application/json"})


def _predict_request(model: str, input_name: str, x: np.ndarray) -> Request:
    """TF Serving's PredictionService/Predict, the input in tensor_content."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.inputs[input_name].CopyFrom(tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT, tensor_content=x.tobytes(),
        tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[{"size": d} for d in x.shape])))
    return Request(True, "/tensorflow.serving.PredictionService/Predict", request.SerializeToString(), {})


def _kserve_rest_request(model: str, input_name: str, x: np.ndarray) -> Request:
    """KServe v2 REST with the binary tensor extension, both ways (tritonclient's default)."""
    header = json.dumps({"inputs": [{"name": input_name, "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    return Request(False, f"/v2/models/{model}/infer", header + x.tobytes(),
                   {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})


def _kserve_grpc_request(model: str, input_name: str, x: np.ndarray) -> Request:
    """KServe v2 gRPC ModelInfer, the input in raw_input_contents."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, raw_input_contents=[x.tobytes()])
    request.inputs.add(name=input_name, datatype="FP32", shape=list(x.shape))
    return Request(True, "/inference.GRPCInferenceService/ModelInfer", request.SerializeToString(), {})


#: --api: the request of `model`'s input `input_name` holding `x`
REQUESTS = {"rest": _rest_request, "grpc": _predict_request, "kserve-rest": _kserve_rest_request,
            "kserve-grpc": _kserve_grpc_request}


class Refused(RuntimeError):
    """An answer other than success; `kind` names it as the C generator does (http_404, grpc_NOT_FOUND...)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


# -- Python clients (in other processes) --------------------------------------------------------------------------
def _caller(port: int, request: Request):
    """A call sending `request` on a connection of its own; refusals raise Refused."""
    if request.grpc:
        import grpc

        method = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary(request.path)  # bytes in, bytes out

        def call():
            try:
                method(request.body, timeout=120)
            except grpc.RpcError as exc:
                raise Refused(f"grpc_{exc.code().name}", exc.details()) from None
        return call
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def call():
        connection.request("POST", request.path, request.body, request.headers)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise Refused(f"http_{response.status}", repr(data[:200]))
    return call


def client_process(api: str, port: int, input_name: str, threads: int, requests: int, shape, deadline_s: float,
                   start_at: float, results) -> None:
    """`threads` clients sending `requests` predicts in all (until `deadline_s` after `start_at`); puts
    (latencies, first send, last answer, errors as (kind, text), CPU seconds of the sending) on `results`."""
    rng = np.random.default_rng(os.getpid())
    callers = [_caller(port, REQUESTS[api](MODEL_NAME, input_name, rng.standard_normal(shape, np.float32)))
               for _ in range(threads)]
    latencies, errors, lock = [], [], threading.Lock()
    remaining = [requests]

    def loop(call):
        while time.time() < start_at + deadline_s:
            with lock:
                if remaining[0] <= 0:
                    return
                remaining[0] -= 1
            begin = time.perf_counter()
            try:
                call()
            except Exception as exc:  # counted and reported; the client goes on
                with lock:
                    errors.append((getattr(exc, "kind", type(exc).__name__), f"{type(exc).__name__}: {str(exc)[:200]}"))
                continue
            with lock:
                latencies.append(time.perf_counter() - begin)

    workers = [threading.Thread(target=loop, args=(c,)) for c in callers]
    time.sleep(max(0.0, start_at - time.time()))
    first, cpu = time.time(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put((latencies, first, time.time(), errors, time.process_time() - cpu))


def python_clients(args, port: int, input_name: str, requests: int, on_start=lambda: None) -> dict:
    """--clients threads in --client-procs processes, one connection each; the clients' summary (see c_clients).
    `on_start` runs once every process is ready, as the clients start."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    shape = (args.rows, SIZES[args.model], SIZES[args.model], 3)
    procs = min(args.client_procs, args.clients)
    threads = [args.clients // procs + (i < args.clients % procs) for i in range(procs)]
    start_at = time.time() + 3.0 + 0.5 * procs  # every process imported and connected before the start
    processes = [context.Process(target=client_process, args=(
        args.api, port, input_name, n, requests * n // args.clients, shape, args.time_limit, start_at, results))
        for n in threads]
    for p in processes:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    on_start()
    parts = [results.get(timeout=args.time_limit + 120) for _ in processes]
    for p in processes:
        p.join()
    latencies = np.array([t for part in parts for t in part[0]]) * 1e3
    errors = [e for part in parts for e in part[3]]
    return {"requests": int(latencies.size), "errors": len(errors),
            "error_kinds": dict(collections.Counter(kind for kind, _ in errors)),
            "first_error": errors[0][1] if errors else None,
            "seconds": max(p[2] for p in parts) - min(p[1] for p in parts),
            "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
            "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
            "client_cpu_s": sum(p[4] for p in parts)}


# -- the C generator (benchmarks/loadgen/loadgen.c) ---------------------------------------------------------------
LOADGEN_SOURCE = os.path.join(HERE, "loadgen", "loadgen.c")


def loadgen_binary() -> str:
    """The C generator, compiled with `cc -O2` once per version of its source into ~/.cache/tftrt_py/loadgen."""
    with open(LOADGEN_SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    path = os.path.join(os.path.expanduser("~"), ".cache", "tftrt_py", "loadgen", digest, "loadgen")
    if not os.path.exists(path):
        compiler = shutil.which("cc")
        if compiler is None:
            raise RuntimeError("the C load generator needs a C compiler: no `cc` on PATH")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        built = subprocess.run([compiler, "-O2", "-o", partial, LOADGEN_SOURCE], capture_output=True, text=True)
        if built.returncode:
            raise RuntimeError(f"cc -O2 {LOADGEN_SOURCE} failed: {built.stderr.strip()[-2000:]}")
        os.replace(partial, path)
    return path


def c_clients(port: int, request: Request, connections: int, requests: int, time_limit: float,
              on_start=lambda: None, procs: int = 1) -> dict:
    """`connections` closed-loop clients in `procs` C processes (connections and requests shared out evenly)
    sending `request` `requests` times in all (until `time_limit` seconds): requests answered, errors, error_kinds
    (kind: count), first_error, seconds (first send to last answer over all processes), p50_ms, p99_ms (of every
    answered request), client_cpu_s."""
    binary = loadgen_binary()
    procs = max(1, min(procs, connections))
    shares = [connections // procs + (i < connections % procs) for i in range(procs)]
    with tempfile.TemporaryDirectory(prefix="loadgen_") as folder:
        body = os.path.join(folder, "body")
        with open(body, "wb") as f:
            f.write(request.body)
        commands = []
        for i, share in enumerate(shares):
            command = [binary, "--proto", "grpc" if request.grpc else "http", "--port", str(port), "--path",
                       request.path, "--body", body, "--connections", str(share), "--requests",
                       str(requests * share // connections), "--time-limit", str(time_limit),
                       "--latencies", os.path.join(folder, f"latencies.{i}")]
            for name, value in request.headers.items():
                command += ["--header", f"{name}: {value}"]
            commands.append(command)
        on_start()
        running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
        parts = []
        try:
            for process in running:
                out, err = process.communicate(timeout=time_limit + 180)
                if process.returncode:
                    raise RuntimeError(f"loadgen failed ({process.returncode}): {err.strip()}")
                parts.append(json.loads(out))
        finally:
            for process in running:  # the others, when one failed
                if process.poll() is None:
                    process.kill()
                    process.wait()
        latencies = np.concatenate([np.fromfile(os.path.join(folder, f"latencies.{i}"), np.float64)
                                    for i in range(procs)]) * 1e3
    kinds = collections.Counter()
    for part in parts:
        kinds.update(part["error_kinds"])
    answered = [part for part in parts if part["requests"]]
    return {"requests": int(latencies.size), "errors": sum(part["errors"] for part in parts),
            "error_kinds": dict(kinds),
            "first_error": next((part["first_error"] for part in parts if part["first_error"]), None),
            "seconds": (max(part["end"] for part in answered) - min(part["start"] for part in answered)
                        if answered else 0.0),
            "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
            "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
            "client_cpu_s": sum(part["cpu_s"] for part in parts)}


# -- a run ----------------------------------------------------------------------------------------------------------
def drive(args, server, input_name: str, requests: int) -> dict:
    """Run the clients for `requests` predicts; throughput and latency of what was answered."""
    port = server.rest_port if args.api.endswith("rest") else server.grpc_port
    before = {}

    def on_start():
        before.update(scrape(server.rest_port), cpu=server.cpu_seconds())

    if args.generator == "c":
        x = np.random.default_rng(0).standard_normal((args.rows, SIZES[args.model], SIZES[args.model], 3),
                                                     np.float32)
        clients = c_clients(port, REQUESTS[args.api](MODEL_NAME, input_name, x), args.clients, requests,
                            args.time_limit, on_start, args.client_procs)
    else:
        clients = python_clients(args, port, input_name, requests, on_start)
    cpu = server.cpu_seconds() - before["cpu"]
    after = scrape(server.rest_port)
    answered, seconds = clients["requests"], clients["seconds"]
    batches = after["batches"] - before["batches"]
    return {**{k: clients[k] for k in ("requests", "errors", "error_kinds", "first_error", "p50_ms", "p99_ms")},
            "seconds": seconds, "req_s": answered / seconds, "rows_s": answered * args.rows / seconds,
            "mean_batch": (after["rows"] - before["rows"]) / batches if batches else None,
            "fallbacks": after["fallbacks"] - before["fallbacks"],
            "server_cpu_ms": cpu / max(1, answered) * 1e3,
            "client_cpu_ms": clients["client_cpu_s"] / max(1, answered) * 1e3}


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_row(row: dict) -> None:
    print(f"{row['mode']:<8} {row['run']:>4} {row['clients']:>7} {row['requests']:>8} {row['errors']:>6} "
          f"{row['req_s']:>8.1f} {row['rows_s']:>8.1f} {_fmt(row['p50_ms'], '8.2f')} {_fmt(row['p99_ms'], '8.2f')} "
          f"{_fmt(row['mean_batch'], '10.2f')} {row['server_cpu_ms']:>10.3f} {row['client_cpu_ms']:>10.3f} "
          f"{row['load_average']:>5.2f}"
          + (f"  {row['fallbacks']:.0f} native-segment runs!" if row["fallbacks"] else "")
          + (f"  first error: {row['first_error']}" if row["errors"] else ""), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SIZES), default="small_cnn")
    p.add_argument("--api", choices=sorted(REQUESTS), default="rest")
    p.add_argument("--generator", choices=("python", "c"), default="python",
                   help="python: --clients threads in --client-procs processes (default); c: one C process "
                        "(benchmarks/loadgen/loadgen.c, compiled with cc)")
    p.add_argument("--server", choices=sorted(SERVERS), default="inprocess")
    p.add_argument("--frontend-workers", type=int, default=0,
                   help="front-end worker processes of the server (tftrt-serve's --frontend_workers; default: 0)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--client-procs", type=int,
                   help="processes the clients run in (default: 2 for the Python clients, 1 for the C generator, "
                        "whose one process keeps a core busy at about 4,000 600 KB gRPC calls a second)")
    p.add_argument("--rows", type=int, default=1, help="rows per request (default: 1)")
    p.add_argument("--requests", type=int, default=3000, help="predicts per mode and run (default: 3000)")
    p.add_argument("--warmup", type=int, default=300, help="predicts before each timed run (default: 300)")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per timed run at most (default: 60)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per mode, alternating (default: 3)")
    p.add_argument("--modes", default="off,on", help="batching modes to run (default: off,on)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout-micros", type=int, default=20000,
                   help="default: 20000 (on 2 CPUs, 32 clients' requests take ~20 ms to arrive: batches fill)")
    p.add_argument("--num-batch-threads", type=int, default=1,
                   help="default: 1 (CPU engines use every core themselves); 0: the CPUs, TF Serving's default")
    p.add_argument("--allowed-batch-sizes", default="", help="e.g. 8,16,32 (default: none, no padding)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--workdir", help="keep the exported and converted model in this folder, and reuse a conversion "
                                     "of the same model for the same batches found there (default: a temporary one)")
    args = p.parse_args(argv)
    if args.client_procs is None:
        args.client_procs = 1 if args.generator == "c" else 2
    if args.client_procs < 1:
        p.error("--client-procs must be at least 1")

    from tftrt_py.serving import BatchingOptions

    allowed = tuple(int(b) for b in args.allowed_batch_sizes.split(",") if b)
    batching = BatchingOptions(max_batch_size=args.max_batch_size, batch_timeout_micros=args.batch_timeout_micros,
                               max_enqueued_batches=max(10, 4 * args.clients // args.max_batch_size + 1),
                               allowed_batch_sizes=allowed,
                               **({"num_batch_threads": args.num_batch_threads} if args.num_batch_threads else {}))
    if args.generator == "c":
        try:
            loadgen_binary()
        except RuntimeError as exc:
            raise SystemExit(f"serve_load.py: {exc}") from None
    modes = args.modes.split(",")
    with contextlib.ExitStack() as stack:
        root = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="serve_load_"))
        started = time.time()
        precision = convert(args.model, root, sorted({args.rows, *allowed, args.max_batch_size}))
        base_path = os.path.join(root, MODEL_NAME)
        compute_ms = batch_compute_ms(os.path.join(base_path, "1"), args.max_batch_size, SIZES[args.model])
        setup = {"model": args.model, "precision": precision, "api": args.api, "server": args.server,
                 "frontend_workers": args.frontend_workers,
                 "generator": args.generator, "client_procs": args.client_procs, "rows": args.rows,
                 "cpus": len(os.sched_getaffinity(0)),
                 "load_average": os.getloadavg(), "batching": {**vars(batching), "allowed_batch_sizes": allowed},
                 "full_batch_compute_ms": compute_ms, "convert_s": time.time() - started}
        print(json.dumps(setup), flush=True)
        print(f"{'mode':<8} {'run':>4} {'clients':>7} {'requests':>8} {'errors':>6} {'req/s':>8} {'rows/s':>8} "
              f"{'p50 ms':>8} {'p99 ms':>8} {'mean batch':>10} {'server CPU':>10} {'client CPU':>10} {'load':>5}  "
              f"(CPU: ms per request)")
        rows = []
        for run in range(args.repeat):
            for mode in modes:
                server = SERVERS[args.server](base_path, batching if mode == "on" else None, args.frontend_workers)
                try:
                    input_name = next(iter(json.loads(urllib.request.urlopen(
                        f"http://127.0.0.1:{server.rest_port}/v1/models/{MODEL_NAME}/metadata", timeout=30).read())
                        ["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]))
                    drive(args, server, input_name, args.warmup)
                    row = {"mode": mode, "run": run, "clients": args.clients, "load_average": os.getloadavg()[0],
                           **drive(args, server, input_name, args.requests)}
                finally:
                    server.stop()
                rows.append(row)
                print_row(row)
    summary = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {k: float(np.median([r[k] for r in mine if r[k] is not None]))
                         for k in ("req_s", "rows_s", "p50_ms", "p99_ms", "mean_batch")
                         if any(r[k] is not None for r in mine)}
        print(f"median {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in summary[mode].items()))
    if {"on", "off"} <= set(summary):
        bound = 2 * args.batch_timeout_micros / 1e3 + compute_ms
        summary["on_over_off"] = summary["on"]["req_s"] / summary["off"]["req_s"]
        summary["p99_bound_ms"] = bound
        print(f"batching on / off: {summary['on_over_off']:.2f}x throughput; p99 with batching "
              f"{summary['on']['p99_ms']:.2f} ms (bound 2 x timeout + one batch's compute = {bound:.2f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"setup": setup, "runs": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
