"""The non-conversion report: which op types stay native, how often, and why."""
from __future__ import annotations

import collections
import dataclasses
from typing import Counter, Dict, Tuple

__all__ = ["NonConversionReport"]


@dataclasses.dataclass
class NonConversionReport:
    total_nodes: int
    converted_nodes: int
    num_segments: int
    #: native node name -> (op type, reason), in topological order
    node_reasons: Dict[str, Tuple[str, str]]

    @property
    def native_nodes(self) -> int:
        return len(self.node_reasons)

    def by_op_type(self) -> Dict[str, Counter[str]]:
        """Op type -> reasons with their counts; most frequent op types first."""
        table: Dict[str, Counter[str]] = collections.defaultdict(collections.Counter)
        for op, reason in self.node_reasons.values():
            table[op][reason] += 1
        return dict(sorted(table.items(), key=lambda item: (-sum(item[1].values()), item[0])))

    def count(self, op_type: str) -> int:
        """How many nodes of `op_type` stay native."""
        return sum(op == op_type for op, _ in self.node_reasons.values())

    def reasons(self, op_type: str) -> Dict[str, int]:
        """Why the nodes of `op_type` stay native: reason -> count."""
        return dict(self.by_op_type().get(op_type, {}))

    def format(self) -> str:
        """A text table: op type, count, reasons (one per line, with counts)."""
        lines = [f"{self.converted_nodes} of {self.total_nodes} nodes converted into {self.num_segments} "
                 f"segment(s); {self.native_nodes} stay native."]
        table = self.by_op_type()
        if not table:
            return lines[0]
        width = max(len("op type"), *map(len, table))
        lines.append(f"{'op type':<{width}}  {'count':>5}  reasons")
        for op, reasons in table.items():
            for i, (reason, n) in enumerate(reasons.most_common()):
                head = f"{op:<{width}}  {sum(reasons.values()):>5}" if i == 0 else " " * (width + 7)
                lines.append(f"{head}  {reason} ({n})")
        return "\n".join(lines)
