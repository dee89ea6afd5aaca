"""What an engine is made of after the builder's passes: one row per layer, or a text table."""
from __future__ import annotations

from typing import List

__all__ = ["layer_rows", "format_layers"]

COLUMNS = ("name", "kind", "precision", "inputs", "outputs")


def layer_rows(engine) -> List[dict]:
    """Name, kind, precision, input shapes and output shapes of each layer of `engine`."""
    return [{"name": l.name, "kind": l.kind, "precision": l.precision,
             "inputs": [list(t.shape) for t in l.inputs], "outputs": [list(t.shape) for t in l.outputs]}
            for l in engine.network.layers]


def _cell(value) -> str:
    if isinstance(value, list):
        return " ".join("x".join(map(str, shape)) or "scalar" for shape in value)
    return "-" if value is None else str(value)


def format_layers(engine) -> str:
    """The layers of `engine` as an aligned text table (shapes written as 8x96x96x3)."""
    rows = [COLUMNS] + [tuple(_cell(row[c]) for c in COLUMNS) for row in layer_rows(engine)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
