"""tftrt-serve: TF Serving's REST and gRPC APIs (predict, status, metadata) and KServe v2's (the Open Inference
Protocol), dynamic batching, health and Prometheus metrics for converted SavedModels. Needs the `serve` extra; see
docs/serving.md.

    from tftrt_py.serving import Server, ModelSpec
    with Server([ModelSpec("cnn", "/models/cnn")], grpc_port=0, rest_port=0) as server:
        ...  # server.grpc_port, server.rest_port
"""
from tftrt_py.serving.config import BatchingOptions, ModelSpec, VersionPolicy
from tftrt_py.serving.server import Server

__all__ = ["Server", "ModelSpec", "VersionPolicy", "BatchingOptions"]
