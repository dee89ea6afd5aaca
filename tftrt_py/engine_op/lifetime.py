"""Loaded models holding engine ops go when the user drops them, as other TensorFlow models do.

``tf.saved_model.load`` keeps every loaded function whose graph holds a node of type ``TRTEngineOp`` in the
process's global default graph, forever: a workaround TensorFlow kept for TF-TRT's engines (its
``function_deserialization.load_function_def_library``). Our op takes that type name, so without more every
converted model ever loaded would stay registered: its functions, its TRTEngineOp kernels and so its engines,
execution contexts and device buffers (an engine op lives while a kernel holds it, see ``dispatcher.release``).

:func:`install` wraps that loader function once per process: functions the load adds to the global default graph
are taken out again (from the Python graph and its C graph) when the load runs eagerly, so each loaded function
lives as long as the objects that use it, TensorFlow's own rule. Engine ops need nothing from that graph: a kernel
finds its native segment in the function library it is instantiated from.
"""
from __future__ import annotations

import functools
import logging
import threading

from tensorflow.python.client import pywrap_tf_session
from tensorflow.python.framework import errors, ops
from tensorflow.python.saved_model import function_deserialization

__all__ = ["install"]

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_installed = False


def install() -> None:
    """Wrap TensorFlow's function-library loader (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        original = function_deserialization.load_function_def_library

        @functools.wraps(original)
        def load_function_def_library(*args, **kwargs):
            if not ops.executing_eagerly_outside_functions():  # graph mode: the load fills the user's graph
                return original(*args, **kwargs)
            graph = ops.get_default_graph()
            before = set(graph._functions)  # pylint: disable=protected-access
            try:
                return original(*args, **kwargs)
            finally:
                _forget(graph, set(graph._functions) - before)  # pylint: disable=protected-access

        function_deserialization.load_function_def_library = load_function_def_library
        _installed = True


def _forget(graph, names) -> None:
    """Take the functions `names` out of `graph` (its Python table and its C function library)."""
    for name in names:
        graph._functions.pop(name, None)  # pylint: disable=protected-access
        try:
            with graph._c_graph.get() as c_graph:  # pylint: disable=protected-access
                pywrap_tf_session.TF_GraphRemoveFunction(c_graph, name)
        except errors.OpError as exc:  # still referenced in that graph: it keeps it, as before
            logger.debug("function %s stays in the default graph: %s", name, exc)
    if names:
        logger.debug("loaded functions not kept in the default graph: %d", len(names))
