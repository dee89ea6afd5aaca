"""Union-find clustering of candidates over data edges, refusing merges that would close a cycle."""
from __future__ import annotations

from typing import AbstractSet, Dict, List, Set

from tftrt_py.convert.graph import GraphView, NodeView, split_ref

__all__ = ["cluster_candidates"]


class _Clusters:
    """Disjoint sets of nodes, each with the nodes outside it that it feeds (data or control)."""

    def __init__(self, view: GraphView, order: List[NodeView]):
        self.index: Dict[str, int] = {node.name: i for i, node in enumerate(order)}
        self.parent: Dict[str, str] = {name: name for name in self.index}
        self.members: Dict[str, List[str]] = {name: [name] for name in self.index}
        self.succ: Dict[str, Set[str]] = {name: set(view.consumers[name]) for name in self.index}

    def find(self, name: str) -> str:
        while self.parent[name] != name:
            self.parent[name] = name = self.parent[self.parent[name]]
        return name

    def merge(self, a: str, b: str) -> None:
        """Join the clusters rooted at a and b (the smaller into the larger)."""
        if len(self.members[a]) < len(self.members[b]):
            a, b = b, a
        small = self.members.pop(b)
        self.parent[b] = a
        self.members[a].extend(small)
        succ_a, succ_b = self.succ[a], self.succ.pop(b)
        succ_a.difference_update(small)
        succ_a.update(name for name in succ_b if self.find(name) != a)

    def can_merge(self, a: str, b: str, limit: int) -> bool:
        """No path between a and b through another cluster, in either direction.

        Every node after topological index `limit` is still a singleton and feeds only later
        nodes, so no such path passes through it.
        """
        return not (self._reaches(a, b, limit) or self._reaches(b, a, limit))

    def _reaches(self, src: str, dst: str, limit: int) -> bool:
        stack, seen = [src], {src}
        while stack:
            root = stack.pop()
            for name in self.succ[root]:
                if self.index[name] > limit:
                    continue
                nxt = self.find(name)
                if nxt == dst:
                    if root != src:
                        return True
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False


def cluster_candidates(view: GraphView, order: List[NodeView], candidates: AbstractSet[str]) -> List[List[str]]:
    """Clusters of candidates (members in topological order), ordered by their first member."""
    clusters = _Clusters(view, order)
    for limit, node in enumerate(order):
        if node.name not in candidates:
            continue
        for ref in node.inputs:
            producer = split_ref(ref)[0]
            if producer not in candidates:
                continue
            a, b = clusters.find(producer), clusters.find(node.name)
            if a != b and clusters.can_merge(a, b, limit):
                clusters.merge(a, b)
    groups: Dict[str, List[str]] = {}
    for node in order:
        if node.name in candidates:
            groups.setdefault(clusters.find(node.name), []).append(node.name)
    return list(groups.values())
