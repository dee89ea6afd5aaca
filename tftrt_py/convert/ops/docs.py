"""The supported-ops page, docs/ops.md, generated from the converter registry.

    python -m tftrt_py.convert.ops.docs            # rewrite docs/ops.md
    python -m tftrt_py.convert.ops.docs --check    # exit 1 when docs/ops.md is out of date

One row per registered op: the dtypes its converter allows (on which attributes), its inputs
(tensor, constant, or known when building), its constraints (the converter's ``constraints``,
else its docstring's first paragraph, else its module's) and the precisions its layers run in.
"""
from __future__ import annotations

import argparse
import inspect
import pathlib
import sys
from typing import List, Optional

from tftrt_py.convert.ops.base import ANY, STATIC, WEIGHT
from tftrt_py.convert.ops.registry import find_converter, registered_ops

__all__ = ["DOCS_PATH", "render", "main"]

DOCS_PATH = pathlib.Path(__file__).resolve().parents[3] / "docs" / "ops.md"

INPUT_KINDS = {ANY: "tensor", WEIGHT: "constant", STATIC: "known when building"}

HEADER = """# Supported TensorFlow ops

Generated from the converter registry by `python -m tftrt_py.convert.ops.docs`; do not edit by hand.

An op converts when its dtypes are listed and its node meets the constraints; otherwise it stays
native, and the conversion report (`converter._report.format()`, or `TFTRT_VMODULE=segmenter=1`)
says why. Inputs, in order (the last kind repeats for further inputs): *tensor* (anything),
*constant* (a Const, possibly behind an Identity), *known when building* (a constant, or computed
from constants and tensor shapes, such as `tf.shape(x)[0]`). Precisions: the builder precisions
the op's layers run in; *exact* for ops that only move data, compare, or fold into constants.

| Op | Module | Dtypes | Inputs | Constraints | Precisions |
|----|--------|--------|--------|-------------|------------|
"""


def _first_paragraph(doc: Optional[str]) -> str:
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "—"


def _dtypes(conv) -> str:
    attrs = [conv.dtype_attr] if isinstance(conv.dtype_attr, str) else list(conv.dtype_attr or ())
    dtypes = ", ".join(conv.allowed_dtypes)
    return f"{'/'.join(attrs)}: {dtypes}" if attrs else dtypes


def _inputs(conv) -> str:
    return ", ".join(INPUT_KINDS.get(kind, kind) for kind in conv.input_spec)


def _constraints(conv) -> str:
    cls = type(conv)
    text = getattr(conv, "constraints", None) or _first_paragraph(cls.__dict__.get("__doc__"))
    return text or _first_paragraph(sys.modules[cls.__module__].__doc__)


def _row(op: str) -> str:
    conv = find_converter(op)
    module = type(conv).__module__.rsplit(".", 1)[-1]
    precisions = ", ".join(getattr(conv, "precisions", ())) or "exact"
    cells = [f"`{op}`", module, _dtypes(conv), _inputs(conv), _constraints(conv), precisions]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render() -> str:
    """The whole page for the converters registered now."""
    ops = registered_ops()
    return HEADER + "".join(_row(op) + "\n" for op in ops) + f"\n{len(ops)} ops.\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    parser.add_argument("--output", type=pathlib.Path, default=DOCS_PATH)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python -m tftrt_py.convert.ops.docs", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(registered_ops())} ops)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
