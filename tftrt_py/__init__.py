"""tftrt_py: a Python analogue of TF-TRT.

Use it as TF-TRT: ``from tftrt_py import trt_convert as trt``. The engine
(:mod:`tftrt_py.engine`) imports and runs without TensorFlow. ``TFTRT_VMODULE``
(:mod:`tftrt_py.logging_config`) turns on per-module verbose logging.
"""
from tftrt_py import logging_config as _logging_config

__version__ = "0.1.0"

_logging_config.configure()
