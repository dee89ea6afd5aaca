"""The engine's error family. Every error carries a code naming its kind."""

__all__ = ["EngineError", "NetworkError", "BuildError", "MissingDynamicRangeError", "PlanError",
           "RuntimeExecutionError", "BackendError"]


class EngineError(Exception):
    """Base of all engine errors; `code` names the kind of failure."""

    code = "ENGINE_ERROR"


class NetworkError(EngineError):
    """A network definition is invalid (bad shapes, unknown layer kind, dangling tensor)."""

    code = "INVALID_NETWORK"


class BuildError(EngineError):
    """The builder could not produce a plan."""

    code = "BUILD_FAILED"


class MissingDynamicRangeError(BuildError):
    """INT8: layers that would run in int8 read tensors without a dynamic range (`tensors` names them)."""

    code = "MISSING_DYNAMIC_RANGE"

    def __init__(self, message: str, tensors=()):
        super().__init__(message)
        self.tensors = list(tensors)


class PlanError(EngineError):
    """A plan file is truncated, corrupted, foreign or of an incompatible version."""

    code = "INVALID_PLAN"


class RuntimeExecutionError(EngineError):
    """Running an engine failed (wrong bindings, shapes or dtypes, or a backend failure)."""

    code = "EXECUTION_FAILED"


class BackendError(EngineError):
    """A backend cannot run a layer kind, or is not available on this machine."""

    code = "BACKEND_UNAVAILABLE"
