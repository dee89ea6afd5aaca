"""Every environment variable tftrt_py reads, in one table: its name, its default and what it does.

The rest of the package asks the :class:`Setting` objects here (``settings.BACKEND.raw()``, ``settings.CONTEXTS.get()``)
instead of reading ``os.environ``, so each variable is documented once and parsed by one rule: the text, stripped
(unset or empty means the default), then the setting's parser. A value its parser refuses is either an error
naming the variable (``strict``), or said once in the log and the default used. docs/configuration.md lists the
same variables (a test compares the two). Values are read at each call: tests and users may change them at run time.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Callable, Dict, Optional

__all__ = ["Setting", "SettingError", "ALL"]

logger = logging.getLogger(__name__)


class SettingError(ValueError):
    """An environment variable holds a value its setting refuses (the message names the variable)."""


class Setting:
    """One environment variable: `parse(text)` turns its stripped text into the value (ValueError: malformed)."""

    def __init__(self, name: str, default: Any, doc: str, parse: Optional[Callable[[str], Any]] = None,
                 strict: bool = False, expect: str = ""):
        self.name, self.default, self.doc = name, default, doc
        self._parse, self.strict, self.expect = parse, strict, expect
        ALL[name] = self

    def raw(self) -> Optional[str]:
        """The variable's text, stripped; None when unset or empty."""
        text = os.environ.get(self.name, "").strip()
        return text or None

    def get(self) -> Any:
        """The parsed value, or the default when unset, empty or (not strict) malformed."""
        text = self.raw()
        if text is None:
            return self.default
        if self._parse is None:
            return text
        try:
            return self._parse(text)
        except ValueError:
            message = f"{self.name}={text!r} is not {self.expect or 'valid'}"
            if self.strict:
                raise SettingError(message) from None
            _warn_once(message, self.default)
            return self.default

    def set_default(self, value: str) -> None:
        """Set the variable for this process (and the libraries it loads) unless it is set already."""
        os.environ.setdefault(self.name, value)

    def add_flag(self, flag: str) -> None:
        """Add `flag` ("--name=value") to this variable of space-separated flags, for this process (and the
        libraries it loads), unless the variable names that flag already."""
        text = os.environ.get(self.name, "")
        name = flag.split("=", 1)[0]
        if not any(part.split("=", 1)[0] == name for part in text.split()):
            os.environ[self.name] = f"{text} {flag}".strip()


@functools.lru_cache(maxsize=None)
def _warn_once(message: str, default) -> None:
    logger.warning("%s; using the default%s", message, "" if default is None else f" ({default})")


ALL: Dict[str, Setting] = {}


# -- parsers ---------------------------------------------------------------------------------------------------------
def whole(minimum: int) -> Callable[[str], int]:
    """A whole number of at least `minimum`."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(f"less than {minimum}")
        return value
    return parse


def positive_number(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("not above 0")
    return value


def flag(text: str) -> bool:
    """TensorFlow's ReadBoolFromEnvVar: 0/false or 1/true, any case."""
    lowered = text.lower()
    if lowered in ("0", "false"):
        return False
    if lowered in ("1", "true"):
        return True
    raise ValueError("not a boolean")


def names(text: str) -> frozenset:
    """Comma-separated names (blanks ignored)."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def path_or_off(text: str) -> Optional[str]:
    """A file path, or None for 0/off/false/none (the feature is off)."""
    return None if text.lower() in ("0", "off", "false", "none") else text


def first_count(text: str) -> int:
    """A positive thread count; OpenMP's nested lists ("4,2") give their outer level."""
    return whole(1)(text.split(",")[0])


# -- the op library ---------------------------------------------------------------------------------------------------
CXX = Setting("CXX", None, "C++ compiler (may hold arguments, e.g. `ccache g++`) that builds the op library; g++ "
                           "when unset")
CACHE_DIR = Setting("TFTRT_PY_CACHE_DIR", None, "where the compiled op library is cached; ~/.cache/tftrt_py/ops "
                                                "when unset")
COMPILE_TIMEOUT = Setting("TFTRT_PY_COMPILE_TIMEOUT", 300.0, "seconds the op library's compile may run",
                          positive_number, strict=True, expect="a positive number of seconds")
OP_LIBRARY = Setting("TFTRT_PY_OP_LIBRARY", None, "a prebuilt op library to load instead of compiling one")

# -- conversion (TF-TRT's) --------------------------------------------------------------------------------------------
OP_DENYLIST = Setting("TF_TRT_OP_DENYLIST", frozenset(), "comma-separated TF op types kept native", names)
EXPERIMENTAL_FEATURES = Setting("TF_TRT_EXPERIMENTAL_FEATURES", frozenset(),
                                "comma-separated TF-TRT experimental features (disable_graph_freezing)", names)

KEEP_VARIABLES = Setting("TFTRT_PY_KEEP_VARIABLES_BYTES", 1 << 29,
                        "a converted SavedModel keeps a model's large variables as variables when they hold this many "
                        "bytes or more together, else saves them as constants (0: always variables)", whole(0),
                        expect="a whole number of bytes")

# -- engine ops -------------------------------------------------------------------------------------------------------
BACKEND = Setting("TFTRT_PY_BACKEND", None, "engine backend of the process's engine ops: numpy, onnxruntime or cupy; "
                                            "the best available when unset")
NATIVE_FALLBACK = Setting("TF_TRT_ALLOW_ENGINE_NATIVE_SEGMENT_EXECUTION", True,
                          "0/false: an engine op that would run its native segment fails instead", flag,
                          expect="a boolean (0, 1, false or true)")
NATIVE_REPLAY = Setting("TFTRT_PY_NATIVE_REPLAY", True, "0/false: every engine-op call goes through Python",
                        lambda text: text.lower() not in ("0", "false"))
CONTEXTS = Setting("TFTRT_PY_CONTEXTS_PER_ENGINE", 4, "execution contexts per engine, for concurrent callers (0: 1)",
                   lambda text: max(1, int(text)), expect="a whole number")
MAX_ASSET_BYTES = Setting("TFTRT_PY_MAX_ENGINE_ASSET_BYTES", 8 << 30, "largest saved-engine asset an engine op reads",
                          lambda text: max(0, int(text)), expect="a number of bytes")

# -- engines ----------------------------------------------------------------------------------------------------------
MAX_ENGINE_BYTES = Setting("TFTRT_PY_MAX_ENGINE_BYTES", None,
                           "most bytes one engine may need at once; from the machine when unset", whole(0),
                           expect="a number of bytes")
MAX_ENGINE_WORK = Setting("TFTRT_PY_MAX_ENGINE_WORK", None, "most multiply-add equivalents one engine may declare",
                          whole(0), expect="a number of multiply-adds")
STRICT_TYPES = Setting("TFTRT_PY_STRICT_TYPES", False, "1: quantized layers keep INT8/FP8 everywhere", flag,
                       expect="a boolean (0, 1, false or true)")
CPU_THREADS = Setting("TFTRT_PY_CPU_THREADS", None, "threads of the CPU backends", first_count,
                      expect="a positive thread count")
OMP_NUM_THREADS = Setting("OMP_NUM_THREADS", None, "CPU threads when TFTRT_PY_CPU_THREADS is unset", first_count,
                          expect="a positive thread count")
OPENBLAS_NUM_THREADS = Setting("OPENBLAS_NUM_THREADS", None, "as OMP_NUM_THREADS", first_count,
                               expect="a positive thread count")
MKL_NUM_THREADS = Setting("MKL_NUM_THREADS", None, "as OMP_NUM_THREADS", first_count, expect="a positive thread count")

# -- the GPU backend --------------------------------------------------------------------------------------------------
GPU_MEMORY_BUDGET = Setting("TFTRT_PY_GPU_MEMORY_BUDGET", None, "device memory all engines may hold together (a size "
                                                                "such as 4GiB); parsed by the cupy backend's memory")
COPY_THREADS = Setting("TFTRT_PY_COPY_THREADS", None, "threads copying host inputs to pinned memory", whole(1),
                       expect="a positive whole number")
CUDA_GRAPHS = Setting("TFTRT_PY_CUDA_GRAPHS", True, "0: cupy engines run without CUDA-graph capture",
                      lambda text: text != "0")
ALLOW_TF32 = Setting("TFTRT_PY_ALLOW_TF32", False, "1: FP32 engines may use TF32 tensor cores", flag,
                     expect="a boolean (0, 1, false or true)")
CUDNN_PLANS = Setting("TFTRT_PY_CUDNN_PLANS", 2, "cuDNN plans built and timed per convolution", whole(1), strict=True,
                      expect="a whole number of at least 1")
CUDNN_RUNTIME_PLANS = Setting("TFTRT_PY_CUDNN_RUNTIME_PLANS", 1, "of those, how many cuDNN may compile at run time",
                              whole(0), strict=True, expect="a whole number")
TRITON_TILES = Setting("TFTRT_PY_TRITON_TILES", 3, "Triton kernels compiled and timed per INT8, FP8 or FP16 "
                       "convolution, of those that suit its size (8: every tile)", whole(1), strict=True,
                       expect="a whole number of at least 1")
TIMING_CACHE = Setting("TFTRT_PY_TIMING_CACHE", os.path.join("~", ".cache", "tftrt_py", "timing_cache.json"),
                       "the cupy backend's timing cache file (0/off: none)", path_or_off)
CHECK_TACTICS = Setting("TFTRT_PY_CHECK_TACTICS", False, "1: each cupy tactic candidate is checked against numpy",
                        lambda text: text == "1")
GEMM = Setting("TFTRT_PY_GEMM", None, "tests: the only cupy GEMM path (cublas, cublaslt or triton)")
INT8_CONV = Setting("TFTRT_PY_INT8_CONV", None, "tests: the only cupy int8 convolution path")
FP8_CONV = Setting("TFTRT_PY_FP8_CONV", None, "tests: the only cupy FP8 convolution path")
CONV_CHAIN = Setting("TFTRT_PY_CONV_CHAIN", None, "cupy: 1 chains every pair of 1x1 convolutions that chains, "
                     "0 none; unset: where timing finds it faster", flag, expect="0 or 1")
POISON = Setting("TFTRT_PY_POISON", False, "tests: 1 fills cupy buffers with NaN bytes", lambda text: text == "1")
ONEDNN_SYSTEM_ALLOCATOR = Setting("TF_ONEDNN_USE_SYSTEM_ALLOCATOR", None,
                                  "TensorFlow's: tftrt-convert sets it to 1 unless it is set, so memory TensorFlow "
                                  "frees goes back to the system (its oneDNN allocator pools it); read only at "
                                  "TensorFlow's first allocation")
COMPILE_NICENESS = Setting("TFTRT_PY_COMPILE_NICENESS", 10, "niceness the processes compiling kernels ahead (Triton's, "
                           "cuDNN plans') add to their own, so INT8 calibration and the build come first on a busy CPU "
                           "(0: the build's priority)", whole(0), expect="a whole number")
CUDA_CACHE_DISABLE = Setting("CUDA_CACHE_DISABLE", False, "the CUDA driver's: 1 turns its JIT cache off, and with it "
                             "building cuDNN plans ahead in other processes during INT8 calibration",
                             lambda text: text not in ("", "0"))
FORCE_GPU_ALLOW_GROWTH = Setting("TF_FORCE_GPU_ALLOW_GROWTH", None, "TensorFlow's: read to decide how engines share a "
                                                                    "GPU with TensorFlow")
XLA_FLAGS = Setting("XLA_FLAGS", None, "XLA's: loading the op library adds --xla_cpu_enable_fast_min_max=false unless "
                    "it names that flag, so XLA's Max and Min on the CPU propagate NaN as TensorFlow's kernels do (in "
                    "loops compiled by XLA, see compile_native_loops); read at XLA's first compile in the process")

# -- logging ----------------------------------------------------------------------------------------------------------
VMODULE = Setting("TFTRT_VMODULE", "", "per-module log levels: segmenter=1,convert=2")
CPP_MIN_LOG_LEVEL = Setting("TF_CPP_MIN_LOG_LEVEL", None, "TensorFlow's: the command-line tools set it to 2 (0 with "
                                                          "--verbose) unless it is set")
