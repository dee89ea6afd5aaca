"""Ray Serve scaling: the converted model served by tftrt_py.serving.ray_app with one replica, then one per GPU, under
the same closed-loop load; images/s, latency, errors, and what bounds it. Optionally a replica killed under load.

    python benchmarks/ray_scale.py [--model resnet50] [--ingress proxy|haproxy] [--apis kserve-rest,rest]
                                   [--replicas 1,2] [--clients 64] [--generator c|python] [--batching tftrt]
                                   [--time-limit 15] [--requests 20000] [--fault] [--cpu] [--json FILE]
                                   [--workdir DIR] [--throughput-optimized] [--access-log]

The model is built and converted by benchmarks/serve_load.py's `convert` (ResNet50 in FP16 where a GPU serves
engines; `--workdir` reuses a conversion found there). A local Ray cluster on loopback serves it: each replica with
one GPU (`--cpu`: no GPU and `--replica-cpus` cores, for a machine without one), behind Ray's ingress: its HTTP
proxy (`--ingress proxy`, one Python process per node that every request and answer crosses) or HAProxy routing
straight to the replicas' own HTTP servers (`--ingress haproxy`, Ray Serve's RAY_SERVE_ENABLE_HA_PROXY);
`--throughput-optimized` sets Ray Serve's RAY_SERVE_THROUGHPUT_OPTIMIZED for the cluster (user code on the replica's
own event loop, buffered request logs, ...), `--access-log` turns the replicas' access log on. For each
replica count and each API (`--apis`: TF Serving's JSON predict `rest`, whose ResNet-50 image is ~3 MB of text, or
KServe v2 with binary tensors `kserve-rest`, 600 KB), one-image predicts from `--clients` closed-loop clients (the C
generator of serve_load.py, or Python clients) after a warm-up, until `--requests` or `--time-limit` seconds.
Printed per run: requests answered and failed, images/s, p50/p99 latency, CPU seconds per second (cores busy) and
CPU ms per request of the ingress (proxy actors and their child processes such as HAProxy) and of the replicas,
cores busy on the whole machine, mean GPU utilization (nvidia-smi); then the ratio of the largest replica count's
throughput to one replica's. With `--fault`, Python clients that log every request run against the largest replica
count; after `--kill-after` seconds one replica's actor is killed (`ray.kill`); printed: requests failed (each
client retries a failed request once after 0.2 s: failures before and after the retry), seconds until Ray's
replacement runs, throughput before the kill and from `--settle` seconds after the replacement, and the
requests answered in each second from the clients' start.
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import serve_load  # noqa: E402  (also puts the repo root and models/ on sys.path)
from serve_load import MODEL_NAME, REQUESTS, SIZES  # noqa: E402

APP = "scale"
REPLICA_PREFIX = f"SERVE_REPLICA::{APP}#"


# -- the cluster -----------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gpu_count() -> int:
    """GPUs nvidia-smi lists (0 without it)."""
    if not shutil.which("nvidia-smi"):
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines()) if done.returncode == 0 else 0


def start_cluster(args, gpus: int, port: int) -> None:
    """A local Ray cluster and Serve's ingress on `port`. RAY_SERVE_ENABLE_HA_PROXY is read when Ray Serve is
    imported, so ray is imported here, after --ingress set it."""
    if args.ingress == "haproxy":
        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")  # shutdown: no 30 s drain
    import ray
    from ray import serve

    cpus = (max(args.replicas) + 1) * args.replica_cpus + 2 if args.cpu else os.cpu_count()
    if args.throughput_optimized:
        os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    env = {k: os.environ[k] for k in ("TFTRT_PY_BACKEND", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_THROUGHPUT_OPTIMIZED",
                                      "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S") if k in os.environ}
    ray.init(address="local", num_cpus=cpus, num_gpus=gpus, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env} if env else None)
    serve.start(http_options={"host": "127.0.0.1", "port": port})


def deploy(args, base_path: str, replicas: int) -> float:
    """build_app with `replicas` replicas (an update in place: only the replica count changes); seconds until they
    all run."""
    from ray import serve

    from tftrt_py.serving.ray_app import build_app

    batching = {} if args.batching == "off" else {
        "max_batch_size": args.max_batch_size, "batch_timeout_micros": args.batch_timeout_micros,
        "num_batch_threads": 1, "max_enqueued_batches": max(10, 4 * args.clients // args.max_batch_size + 1)}
    started = time.time()
    serve.run(build_app({"model_name": MODEL_NAME, "model_base_path": base_path, "batching": args.batching,
                         **batching, "min_replicas": replicas, "max_replicas": replicas,
                         "num_gpus": 0 if args.cpu else 1, "num_cpus": args.replica_cpus,
                         "max_ongoing_requests": max(64, args.clients), "rest_threads": max(64, args.clients),
                         "file_system_poll_wait_seconds": 0, "access_log": args.access_log}),
              name=APP, route_prefix="/")
    deadline = started + 300
    while running_replicas() != replicas:
        if time.time() > deadline:
            raise RuntimeError(f"{running_replicas()} of {replicas} replicas running after 300 s")
        time.sleep(0.2)
    return time.time() - started


def running_replicas() -> int:
    from ray import serve

    status = serve.status().applications.get(APP)
    return sum(d.replica_states.get("RUNNING", 0) for d in status.deployments.values()) if status else 0


def replica_actors() -> list:
    import ray

    return [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(REPLICA_PREFIX)]


def _descendants(pid: int) -> list:
    try:
        children = serve_load._children(pid)
    except OSError:
        return []
    return children + [d for c in children for d in _descendants(c)]


def _pid(actor_self) -> int:
    return os.getpid()


def ray_pids() -> dict:
    """Process ids of the ingress (Serve's proxy actors and their children, HAProxy among them) and the replicas,
    asked of each named actor (the state API would need Ray's dashboard)."""
    import ray

    groups = {"ingress": [], "replicas": []}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        group = ("replicas" if actor["name"].startswith(REPLICA_PREFIX) else
                 "ingress" if actor["name"].startswith("SERVE_PROXY_ACTOR") else None)
        if group:
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            pid = ray.get(handle.__ray_call__.remote(_pid), timeout=60)
            groups[group] += [pid, *_descendants(pid)] if group == "ingress" else [pid]
    return groups


def _cpu(pid: int) -> float:
    try:
        return serve_load._cpu_seconds(pid)
    except OSError:  # gone (a killed replica)
        return 0.0


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy so far (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class GpuSampler:
    """Mean utilization of each GPU, sampled by nvidia-smi every half second while running."""

    def __init__(self, enabled: bool):
        self.samples, self.stop = collections.defaultdict(list), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True) if enabled else None

    def _run(self):
        while not self.stop.wait(0.5):
            done = subprocess.run(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True)
            for line in done.stdout.splitlines():
                index, util = (v.strip() for v in line.split(","))
                self.samples[int(index)].append(float(util))

    def __enter__(self):
        if self.thread:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        if self.thread:
            self.thread.join()

    def means(self) -> dict:
        return {i: float(np.mean(v)) for i, v in sorted(self.samples.items())}


# -- a measurement ----------------------------------------------------------------------------------------------------
def input_name(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models/{MODEL_NAME}/metadata", timeout=60) as r:
        body = json.loads(r.read())
    return next(iter(body["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]))


def load(args, api: str, port: int, name: str, requests: int, time_limit: float, on_start) -> dict:
    """Closed-loop one-image predicts: serve_load's C generator or Python clients (their summary)."""
    if args.generator == "c":
        x = np.random.default_rng(0).standard_normal((1, SIZES[args.model], SIZES[args.model], 3), np.float32)
        return serve_load.c_clients(port, REQUESTS[api](MODEL_NAME, name, x), args.clients, requests, time_limit,
                                    on_start)
    settings = types.SimpleNamespace(api=api, rows=1, model=args.model, clients=args.clients,
                                     client_procs=args.client_procs, time_limit=time_limit)
    return serve_load.python_clients(settings, port, name, requests, on_start)


def measure(args, api: str, port: int, name: str, replicas: int) -> dict:
    """One timed run: throughput, latency, errors, and the CPU of the ingress, the replicas and the machine."""
    load(args, api, port, name, args.warmup, 60, lambda: None)
    pids, before = ray_pids(), {}

    def on_start():
        before.update({group: sum(_cpu(p) for p in ps) for group, ps in pids.items()},
                      machine=machine_busy_seconds(), wall=time.time())

    with GpuSampler(not args.cpu and shutil.which("nvidia-smi") is not None) as gpus:
        clients = load(args, api, port, name, args.requests, args.time_limit, on_start)
    wall = time.time() - before["wall"]
    answered, seconds = clients["requests"], clients["seconds"]
    spent = {group: sum(_cpu(p) for p in ps) - before[group] for group, ps in pids.items()}
    return {"replicas": replicas, "api": api, "requests": answered, "errors": clients["errors"],
            "error_kinds": clients["error_kinds"], "first_error": clients["first_error"], "seconds": seconds,
            "images_s": answered / seconds if seconds else 0.0, "p50_ms": clients["p50_ms"],
            "p99_ms": clients["p99_ms"],
            "ingress_cores": spent["ingress"] / wall, "ingress_cpu_ms": spent["ingress"] / max(1, answered) * 1e3,
            "replica_cores": spent["replicas"] / wall, "replica_cpu_ms": spent["replicas"] / max(1, answered) * 1e3,
            "ingress_processes": len(pids["ingress"]),
            "machine_cores": (machine_busy_seconds() - before["machine"]) / wall,
            "client_cpu_ms": clients["client_cpu_s"] / max(1, answered) * 1e3, "gpu_util": gpus.means()}


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_row(row: dict) -> None:
    gpu = " ".join(f"{u:.0f}" for u in row["gpu_util"].values()) or "-"
    print(f"{row['replicas']:>8} {row['api']:<12} {row['requests']:>8} {row['errors']:>6} {row['images_s']:>9.1f} "
          f"{_fmt(row['p50_ms'], '8.2f')} {_fmt(row['p99_ms'], '8.2f')} {row['ingress_cores']:>7.2f} "
          f"{row['ingress_cpu_ms']:>8.3f} {row['replica_cores']:>7.2f} {row['replica_cpu_ms']:>8.3f} "
          f"{row['machine_cores']:>7.2f} {gpu:>8}" + (f"  first error: {row['first_error']}" if row["errors"] else ""),
          flush=True)


def bound(row: dict, cpus: int, ingress: str) -> str:
    """What most likely limits a run, from its utilizations. Ray's proxy is one Python process (one core at most);
    HAProxy runs RAY_SERVE_HAPROXY_NBTHREAD threads (default 4)."""
    if row["gpu_util"] and min(row["gpu_util"].values()) >= 90:
        return "GPU (every GPU >= 90% busy)"
    ingress_cores = 1 if ingress == "proxy" else int(os.environ.get("RAY_SERVE_HAPROXY_NBTHREAD", "4"))
    if row["ingress_cores"] >= 0.85 * ingress_cores:
        return f"the ingress ({row['ingress_cores']:.2f} cores busy of {ingress_cores})"
    if row["machine_cores"] >= 0.85 * cpus:
        return f"the machine's CPUs ({row['machine_cores']:.1f} of {cpus} cores busy)"
    per = row["replica_cores"] / row["replicas"]
    if per >= 0.85:
        return f"the replicas' CPU ({per:.2f} cores busy each)"
    return "none saturated (latency-bound: more clients may help)"


# -- a replica killed under load ------------------------------------------------------------------------------------
def logging_client(port: int, request, threads: int, stop, results) -> None:
    """`threads` closed-loop clients until `stop` is set; puts [(sent, answered, first try's error kind or None,
    retry's error kind or None)] (wall-clock seconds) on `results`. A failed request is retried once after 0.2 s."""
    log, lock = [], threading.Lock()

    def loop():
        call = serve_load._caller(port, request)
        while not stop.is_set():
            sent, kinds = time.time(), []
            for attempt in range(2):
                try:
                    call()
                    break
                except Exception as exc:  # counted; a new connection for the retry
                    kinds.append(getattr(exc, "kind", type(exc).__name__))
                    call = serve_load._caller(port, request)
                    if attempt == 0:
                        time.sleep(0.2)
            with lock:
                log.append((sent, time.time(), kinds[0] if kinds else None, kinds[1] if len(kinds) > 1 else None))

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results.put(log)


def fault(args, api: str, port: int, name: str, replicas: int) -> dict:
    """Kill one replica under load; failures, time to the replacement, throughput before and after."""
    import ray

    x = np.random.default_rng(0).standard_normal((1, SIZES[args.model], SIZES[args.model], 3), np.float32)
    request = REQUESTS[api](MODEL_NAME, name, x)
    context = multiprocessing.get_context("spawn")
    stop, results = context.Event(), context.Queue()
    procs = min(args.client_procs, args.fault_clients)
    threads = [args.fault_clients // procs + (i < args.fault_clients % procs) for i in range(procs)]
    processes = [context.Process(target=logging_client, args=(port, request, n, stop, results)) for n in threads]
    for p in processes:
        p.start()
    replaced, killed = None, time.time() + args.kill_after
    try:
        time.sleep(args.kill_after)
        first = {a["name"] for a in replica_actors()}
        victim = sorted(replica_actors(), key=lambda a: a["name"])[0]
        killed = time.time()
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
        deadline = killed + args.replace_limit
        while time.time() < deadline:
            names = {a["name"] for a in replica_actors()}
            if len(names) == replicas and names - first and running_replicas() == replicas:
                replaced = time.time()
                break
            time.sleep(0.1)
        time.sleep(args.settle + args.window if replaced else 0)
    finally:
        stop.set()
        log = [entry for _ in processes for entry in results.get(timeout=120)]
        for p in processes:
            p.join()
    end = max(entry[1] for entry in log) if log else time.time()
    start = min(entry[0] for entry in log) if log else killed

    def rate(lo, hi):
        return sum(lo <= e[1] < hi and e[2] is None for e in log) / (hi - lo) if hi > lo else None

    failed_first = [e for e in log if e[2] is not None]
    failed = [e for e in failed_first if e[3] is not None]
    return {"replicas": replicas, "api": api, "clients": args.fault_clients, "requests": len(log),
            "failed_first_try": len(failed_first), "failed_after_retry": len(failed),
            "failure_kinds": dict(collections.Counter(e[2] for e in failed_first)),
            "failed_sent_after_replacement": sum(e[0] > replaced for e in failed_first) if replaced else None,
            "replaced_after_s": replaced - killed if replaced else None,
            "before_req_s": rate(max(start + 1, killed - args.window), killed),
            "during_req_s": rate(killed, replaced or end),
            "after_req_s": rate(replaced + args.settle, end) if replaced else None,
            # requests answered in each second, the first `first` seconds from the kill (negative: before it)
            "per_second": {"first": int(start - killed) - 1, "answered": [
                sum(killed + i <= e[1] < killed + i + 1 and e[2] is None for e in log)
                for i in range(int(start - killed) - 1, int(end - killed) + 1)]}}


# -- the run -------------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SIZES), default="small_cnn")
    p.add_argument("--cpu", action="store_true", help="replicas without a GPU, --replica-cpus cores each")
    p.add_argument("--replica-cpus", type=int, default=1, help="CPU cores per replica (default: 1)")
    p.add_argument("--replicas", default="1,2", help="replica counts, in order (default: 1,2)")
    p.add_argument("--ingress", choices=("proxy", "haproxy"), default="proxy")
    p.add_argument("--throughput-optimized", action="store_true",
                   help="Ray Serve's RAY_SERVE_THROUGHPUT_OPTIMIZED=1 for the cluster")
    p.add_argument("--access-log", action="store_true", help="the replicas write Ray Serve's access log")
    p.add_argument("--apis", default="kserve-rest,rest", help="of rest, kserve-rest (default: both)")
    p.add_argument("--generator", choices=("c", "python"), default="c",
                   help="c: serve_load.py's C generator (needs cc; python without one); python: client processes")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--client-procs", type=int, default=4, help="processes of the Python clients (default: 4)")
    p.add_argument("--requests", type=int, default=20000, help="predicts per timed run at most (default: 20000)")
    p.add_argument("--warmup", type=int, default=300, help="predicts before each timed run (default: 300)")
    p.add_argument("--time-limit", type=float, default=15.0, help="seconds per timed run at most (default: 15)")
    p.add_argument("--batching", choices=("off", "tftrt", "ray"), default="tftrt",
                   help="each replica's batching (default: tftrt, TF Serving's scheduler)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout-micros", type=int, default=2000)
    p.add_argument("--fault", action="store_true", help="then kill a replica under load")
    p.add_argument("--fault-clients", type=int, default=32, help="Python clients of the fault run (default: 32)")
    p.add_argument("--kill-after", type=float, default=6.0)
    p.add_argument("--replace-limit", type=float, default=120.0, help="seconds to wait for the replacement")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after the replacement not counted")
    p.add_argument("--window", type=float, default=5.0, help="seconds of throughput counted before and after")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--workdir", help="keep the converted model here; a conversion found there is reused")
    args = p.parse_args(argv)
    args.replicas = [int(n) for n in args.replicas.split(",")]
    apis = args.apis.split(",")
    unknown = set(apis) - {"rest", "kserve-rest"}
    if unknown:
        p.error(f"--apis: unknown {sorted(unknown)}")
    if args.generator == "c":
        try:
            serve_load.loadgen_binary()
        except RuntimeError as exc:
            print(f"ray_scale.py: {exc}: Python clients instead", flush=True)
            args.generator = "python"
    gpus = 0 if args.cpu else gpu_count()
    if not args.cpu and gpus < max(args.replicas):
        p.error(f"{max(args.replicas)} replicas need as many GPUs, {gpus} found (--cpu: CPU replicas)")

    import tempfile

    import ray
    from ray import serve

    root = args.workdir or tempfile.mkdtemp(prefix="ray_scale_")
    started = time.time()
    batches = sorted({1, args.max_batch_size} if args.batching != "off" else {1})
    precision = serve_load.convert(args.model, root, batches)
    setup = {"model": args.model, "precision": precision, "ingress": args.ingress, "generator": args.generator,
             "clients": args.clients, "batching": args.batching, "max_batch_size": args.max_batch_size,
             "batch_timeout_micros": args.batch_timeout_micros, "gpus": gpus, "cpu": args.cpu,
             "throughput_optimized": args.throughput_optimized, "access_log": args.access_log,
             "cpus": os.cpu_count(), "convert_s": time.time() - started, "load_average": os.getloadavg()}
    print(json.dumps(setup), flush=True)
    port = _free_port()
    rows, faults, deploys, summary = [], [], {}, {}

    def save():  # after each result: a run cut short by a time limit keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"setup": setup, "deploy_s": deploys, "runs": rows, "ratios": summary, "fault": faults}, f,
                          indent=1)

    try:
        start_cluster(args, gpus, port)
        for replicas in args.replicas:
            deploys[replicas] = deploy(args, os.path.join(root, MODEL_NAME), replicas)
            name = input_name(port)
            print(f"{replicas} replica(s) running after {deploys[replicas]:.1f} s", flush=True)
            print(f"{'replicas':>8} {'api':<12} {'requests':>8} {'errors':>6} {'images/s':>9} {'p50 ms':>8} "
                  f"{'p99 ms':>8} {'ingr.c':>7} {'ingr.ms':>8} {'repl.c':>7} {'repl.ms':>8} {'mach.c':>7} "
                  f"{'GPU %':>8}  (c: cores busy; ms: CPU ms per request)", flush=True)
            for api in apis:
                row = measure(args, api, port, name, replicas)
                row["bound"] = bound(row, os.cpu_count(), args.ingress)
                rows.append(row)
                save()
                print_row(row)
                print(f"{'':>8} bound: {row['bound']}", flush=True)
        if args.fault:
            result = fault(args, apis[0], port, input_name(port), args.replicas[-1])
            faults.append(result)
            save()
            print("fault: " + json.dumps(result), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    for api in apis:
        mine = {r["replicas"]: r for r in rows if r["api"] == api}
        if len(mine) > 1 and mine.get(args.replicas[0], {}).get("images_s"):
            top = args.replicas[-1]
            summary[api] = mine[top]["images_s"] / mine[args.replicas[0]]["images_s"]
            print(f"{api}: {top} replicas / {args.replicas[0]}: {summary[api]:.2f}x images/s "
                  f"({mine[top]['images_s']:.1f} / {mine[args.replicas[0]]['images_s']:.1f})", flush=True)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
