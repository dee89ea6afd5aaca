"""tftrt-serve: serve converted SavedModels with TF Serving's REST and gRPC APIs and its command-line flags (and
KServe v2's APIs on the same ports).

    tftrt-serve --port=8500 --rest_api_port=8501 --model_name=cnn --model_base_path=/models/cnn
    tftrt-serve --model_config_file=models.config --enable_batching --batching_parameters_file=batching.config

As TF Serving: --rest_api_port=0 (the default) leaves REST off; versions are the numbered folders of each base
path, looked at again every --file_system_poll_wait_seconds (default 1; 0: only at start) to load new versions and
unload those the version policy no longer selects. Flags of TF Serving this server does not implement are
accepted and ignored with a warning.
"""
from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Optional, Sequence

from tftrt_py.tools.cli import ToolError, add_common_flags, run_tool

logger = logging.getLogger(__name__)

__all__ = ["build_parser", "server_from_args", "main"]

#: Seconds between the main thread's checks for SIGTERM/SIGINT while it serves. The kernel may hand a signal to any
#: thread of the process (TensorFlow's, gRPC's, CUDA's); Python then runs the handler on the main thread, but only
#: once that thread runs again: one blocked in a wait without a timeout would never stop.
SIGNAL_CHECK_S = 0.5

#: TF Serving flags accepted so deployment scripts run unchanged, but without effect here
IGNORED_FLAGS = ("rest_api_timeout_in_ms", "model_config_file_poll_wait_seconds", "monitoring_config_file",
                 "grpc_channel_arguments", "grpc_socket_path", "ssl_config_file",
                 "platform_config_file", "saved_model_tags", "per_process_gpu_memory_fraction",
                 "flush_filesystem_caches", "tensorflow_session_parallelism", "num_load_threads",
                 "num_unload_threads", "max_num_load_retries", "load_retry_interval_micros",
                 "enable_signature_method_name_check", "xla_cpu_compilation_enabled", "enable_profiler",
                 "allow_version_labels_for_unavailable_models")


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value in ("true", "1")


def _whole(unit: str, zero: str):
    """An argparse type: a whole number of `unit` >= 0, where 0 means `zero`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of {unit}, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"expected {unit} >= 0 (0: {zero}), got {value}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tftrt-serve", description=__doc__.split("\n\n")[0],
                                epilog="Exit codes: 0 stopped by a signal, 1 the server could not start, "
                                       "2 bad arguments.")
    p.add_argument("--port", type=int, default=8500, help="gRPC port (default: %(default)s; 0: any free port)")
    p.add_argument("--rest_api_port", type=int, default=0, help="REST port (default: 0, REST off)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (ours; default: %(default)s)")
    p.add_argument("--model_name", default="default", help="name of the model given by --model_base_path")
    p.add_argument("--model_base_path", help="folder holding the model's numbered version folders")
    p.add_argument("--model_config_file", help="text-proto ModelServerConfig (overrides --model_name/base_path)")
    p.add_argument("--file_system_poll_wait_seconds", default=1,
                   type=_whole("seconds", "look for versions only at start"),
                   help="seconds between looks at each base path for versions to load and unload "
                        "(default: %(default)s; 0: only at start)")
    p.add_argument("--enable_batching", type=_bool, nargs="?", const=True, default=False,
                   help="batch predict requests (TF Serving's batching parameters)")
    p.add_argument("--batching_parameters_file", help="text-proto BatchingParameters (with --enable_batching)")
    p.add_argument("--rest_api_num_threads", type=int, default=64,
                   help="threads decoding and running REST requests (default: %(default)s)")
    p.add_argument("--grpc_max_threads", type=int, default=64,
                   help="threads running unbatched gRPC predicts (default: %(default)s)")
    p.add_argument("--frontend_workers", default=0,
                   type=_whole("processes", "the front ends run in the model process"),
                   help="processes serving REST and gRPC on the same ports, sending tensors to this process's "
                        "models through shared memory (ours; default: 0, the front ends run in this process)")
    p.add_argument("--enable_model_warmup", type=_bool, nargs="?", const=True, default=True,
                   help="replay a version's assets.extra/tf_serving_warmup_requests before it serves (default: "
                        "%(default)s)")
    p.add_argument("--num_request_iterations_for_warmup", type=_whole("iterations", "no warm-up"), default=1,
                   help="times each warm-up request runs (default: %(default)s)")
    p.add_argument("--tensorflow_intra_op_parallelism", type=int, default=0, help="TF intra-op threads (0: TF's)")
    p.add_argument("--tensorflow_inter_op_parallelism", type=int, default=0, help="TF inter-op threads (0: TF's)")
    for flag in IGNORED_FLAGS:
        p.add_argument(f"--{flag}", help=argparse.SUPPRESS)
    add_common_flags(p)
    return p


def server_from_args(args: argparse.Namespace):
    """The Server the parsed flags describe (not started)."""
    from tftrt_py.serving.config import ModelSpec, read_batching_parameters_file, read_model_config_file
    from tftrt_py.serving.server import Server

    for flag in IGNORED_FLAGS:
        if getattr(args, flag) is not None:
            logger.warning("--%s is accepted for TF Serving compatibility and ignored", flag)
    if args.model_config_file:
        if args.model_base_path:
            logger.warning("--model_config_file given: --model_name and --model_base_path are ignored")
        models = read_model_config_file(args.model_config_file)
    elif args.model_base_path:
        models = [ModelSpec(args.model_name, args.model_base_path)]
    else:
        raise ToolError("give --model_base_path (one model) or --model_config_file (several)")
    if args.batching_parameters_file and not args.enable_batching:
        logger.warning("--batching_parameters_file is ignored without --enable_batching")
    batching = read_batching_parameters_file(args.batching_parameters_file) if args.enable_batching else None
    return Server(models, grpc_port=args.port, rest_port=args.rest_api_port or None, host=args.host,
                  batching=batching, grpc_threads=args.grpc_max_threads, rest_threads=args.rest_api_num_threads,
                  file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
                  frontend_workers=args.frontend_workers,
                  warmup_iterations=args.num_request_iterations_for_warmup if args.enable_model_warmup else 0)


def _set_tf_threads(args: argparse.Namespace) -> None:
    if args.tensorflow_intra_op_parallelism or args.tensorflow_inter_op_parallelism:
        import tensorflow as tf

        if args.tensorflow_intra_op_parallelism:
            tf.config.threading.set_intra_op_parallelism_threads(args.tensorflow_intra_op_parallelism)
        if args.tensorflow_inter_op_parallelism:
            tf.config.threading.set_inter_op_parallelism_threads(args.tensorflow_inter_op_parallelism)


def _serve(args: argparse.Namespace) -> int:
    server = server_from_args(args)
    _set_tf_threads(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    apis = [f"gRPC on {args.host}:{server.grpc_port}"]
    if server.rest_port is not None:
        apis.append(f"REST on {args.host}:{server.rest_port}")
    print(f"tftrt-serve: serving {', '.join(m.name for m in server.models)}; {', '.join(apis)}", flush=True)
    try:
        while not stop.wait(SIGNAL_CHECK_S):
            pass
    finally:
        server.stop()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(build_parser(), _serve, argv)


if __name__ == "__main__":
    raise SystemExit(main())
