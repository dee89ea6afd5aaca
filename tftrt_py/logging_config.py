"""Per-module verbose logging from the TFTRT_VMODULE environment variable (like TF_CPP_VMODULE).

``TFTRT_VMODULE=segmenter=2,convert=1`` sets the logger of each named module prefix under
``tftrt_py`` (``tftrt_py.segmenter``, ``tftrt_py.convert``) to a verbosity: 1 logs INFO, 2 and
above DEBUG, 0 WARNING. At level 1 the segmenter logs every node that stays native and why.
Records propagate as usual; when the root logger has no handler yet, one stderr handler on the
``tftrt_py`` logger shows them.
Applied when :mod:`tftrt_py` is imported; needs no TensorFlow.
"""
from __future__ import annotations

import logging
from typing import Dict, Optional

from tftrt_py import settings

__all__ = ["VMODULE_ENV", "parse_vmodule", "configure", "level_for"]

VMODULE_ENV = settings.VMODULE.name
ROOT = "tftrt_py"
FORMAT = "%(asctime)s %(levelname).1s %(name)s] %(message)s"


def level_for(verbosity: int) -> int:
    """TF_CPP_VMODULE-style verbosity -> logging level."""
    if verbosity >= 2:
        return logging.DEBUG
    return logging.INFO if verbosity == 1 else logging.WARNING


def parse_vmodule(spec: str) -> Dict[str, int]:
    """"segmenter=2,convert.ops=1" -> {"tftrt_py.segmenter": 2, "tftrt_py.convert.ops": 1}.

    Names may carry the ``tftrt_py.`` prefix; malformed entries raise ValueError.
    """
    levels = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        name, sep, value = entry.partition("=")
        name = name.strip().strip(".")
        if not sep or not name or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{VMODULE_ENV} entry {entry!r} is not module=level")
        if name != ROOT and not name.startswith(ROOT + "."):
            name = f"{ROOT}.{name}"
        levels[name] = int(value)
    return levels


_handler: Optional[logging.Handler] = None


def configure(spec: Optional[str] = None) -> Dict[str, int]:
    """Apply `spec` (default: the TFTRT_VMODULE environment variable); returns the levels set.

    A malformed spec is reported as a warning and ignored, so importing tftrt_py never fails on it.
    """
    global _handler
    spec = settings.VMODULE.get() if spec is None else spec
    try:
        levels = parse_vmodule(spec)
    except ValueError as exc:
        logging.getLogger(ROOT).warning("ignoring %s: %s", VMODULE_ENV, exc)
        return {}
    for name, verbosity in levels.items():
        logging.getLogger(name).setLevel(level_for(verbosity))
    if levels and _handler is None and not logging.getLogger().handlers:  # else the app's handlers show them
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter(FORMAT))
        logging.getLogger(ROOT).addHandler(_handler)
    return levels
