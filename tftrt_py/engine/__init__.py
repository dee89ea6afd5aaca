"""tftrt_py's inference engine (the TensorRT analogue). Imports without TensorFlow.

    net = Network("mlp"); x = net.add_input("TensorRTInputPH_0", "float32", (8, 16)); ...
    engine = Builder(BuilderConfig(precision="FP32")).build_engine(net)
    plan = engine.serialize()
    engine = Runtime().deserialize_cuda_engine(plan)
    outputs = engine.create_execution_context().execute({"TensorRTInputPH_0": x})
"""
from tftrt_py.engine.builder import Builder, BuilderConfig
from tftrt_py.engine.errors import (BackendError, BuildError, EngineError, NetworkError, PlanError,
                                    RuntimeExecutionError)
from tftrt_py.engine.network import Layer, Network, Tensor
from tftrt_py.engine.runtime import Engine, ExecutionContext, Profiler, Runtime

__all__ = ["Network", "Layer", "Tensor", "Builder", "BuilderConfig", "Engine", "ExecutionContext", "Runtime",
           "Profiler", "EngineError", "NetworkError", "BuildError", "PlanError", "RuntimeExecutionError",
           "BackendError"]
