"""What the command-line tools share: error handling and exit codes, logging, text tables.

Exit codes: 0 success, 1 an error (one line on stderr; the traceback too with --verbose),
2 bad arguments (argparse). Imports no TensorFlow.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import traceback
from typing import Callable, List, Optional, Sequence, Tuple

from tftrt_py import settings

__all__ = ["ToolError", "run_tool", "add_common_flags", "one_line", "table", "shape_str", "nbytes_str",
           "short_names"]

#: Lines of TensorFlow's runtime errors that say nothing about the cause: the header, the stack-trace
#: placeholder, and the node/op trailers ("[[{{node x}}]]", "[Op:__inference_f_12]").
_TF_BOILERPLATE = re.compile(r"Graph execution error:|Detected at node .* defined at \(most recent call last\):|"
                             r"<stack traces unavailable>|(\[\[[^\n]*?\]\]\s*)+(\[Op:[^\]]*\])?")


class ToolError(Exception):
    """An error the user can fix; printed without a traceback."""


def one_line(exc: BaseException) -> str:
    """The message of `exc` on one line: its lines joined, TensorFlow's boilerplate lines left out."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join([line for line in lines if not _TF_BOILERPLATE.fullmatch(line)] or lines)


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="log progress (INFO) and print tracebacks of errors")


def run_tool(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], Optional[int]],
             argv: Optional[Sequence[str]] = None) -> int:
    """Parse `argv` (exit 2 on bad arguments), run `body`, turn exceptions into exit code 1."""
    args = parser.parse_args(argv)
    verbose = getattr(args, "verbose", False)
    settings.CPP_MIN_LOG_LEVEL.set_default("0" if verbose else "2")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(body(args) or 0)
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.
        return 0
    except Exception as exc:  # every failure becomes one clear line (and exit code 1)
        if verbose:
            traceback.print_exc()
        message = one_line(exc) or type(exc).__name__
        if not isinstance(exc, (ToolError, ValueError, OSError)):
            message = f"{type(exc).__name__}: {message}"
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 1


def shape_str(shape) -> str:
    """(4, 32, 32, 3) -> '4x32x32x3'; unknown dims as '?'; a scalar as 'scalar'."""
    if shape is None:
        return "?"
    return "x".join("?" if d is None or d < 0 else str(d) for d in shape) or "scalar"


def nbytes_str(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n} B"


def table(headers: Sequence[str], rows: Sequence[Sequence], right: Sequence[int] = ()) -> List[str]:
    """An aligned text table: header, rule, rows; columns in `right` are right-aligned."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return [line(cells[0]).rstrip(), "  ".join("-" * w for w in widths)] + [line(r).rstrip() for r in cells[1:]]


def short_names(names: Sequence[str], width: int = 72) -> Tuple[str, List[str]]:
    """(common scope, names without it): fused names 'a/x + a/y' lose the scope in each part; names longer
    than `width` keep their start and end around '...'."""
    parts = [name.split(" + ") for name in names]
    scopes = [p.split("/")[:-1] for ps in parts for p in ps]
    common = os.path.commonprefix(scopes) if scopes else []
    prefix = "/".join(common) + "/" if common else ""
    out = []
    for ps in parts:
        name = " + ".join(p[len(prefix):] for p in ps)
        out.append(name if len(name) <= width else name[:width // 2 - 2] + "..." + name[-(width - width // 2 - 1):])
    return prefix, out
