"""tftrt_py: a Python analogue of TF-TRT.

Use it as TF-TRT: ``from tftrt_py import trt_convert as trt``. The engine
(:mod:`tftrt_py.engine`) imports and runs without TensorFlow.
"""
__version__ = "0.1.0"
