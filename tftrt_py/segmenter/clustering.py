"""Clusters of candidates, grown as TF-TRT's SegmentGraph grows them (segment.cc).

Nodes are visited in reverse topological order. A candidate absorbs the clusters of the candidates reading
its outputs (data edges), again as its cluster gains consumers, unless another path leads from it to that
consumer: one engine would then both feed the path and wait for it (control edges count for paths). So
clusters grow from the outputs towards the inputs.

Nodes annotated with different TF-TRT max batch sizes (``_tftrt_op_max_batch_size``) never share a cluster
(TF-TRT's ClusterBatchSize::MergeIfCompatible).

The contracted graph (one node per cluster) keeps a topological numbering, renumbered at each merge as in
Pearce and Kelly's dynamic topological order, so a path search visits only clusters ranked between its ends.
"""
from __future__ import annotations

from typing import AbstractSet, Callable, Dict, List, Optional, Set

from tftrt_py.convert.graph import GraphView, NodeView, split_ref
from tftrt_py.convert.rewrite import MAX_BATCH_SIZE_ANNOTATION

__all__ = ["cluster_candidates"]


def cluster_candidates(view: GraphView, order: List[NodeView], candidates: AbstractSet[str]) -> List[List[str]]:
    """Clusters of candidates (members in topological order), ordered by their first member."""
    graph = _Contraction(view, order)
    for node in reversed(order):
        if node.name in candidates:
            graph.grow(node.name, candidates)
    groups: Dict[str, List[str]] = {}
    for node in order:
        if node.name in candidates:
            groups.setdefault(graph.find(node.name), []).append(node.name)
    return list(groups.values())


class _Contraction:
    """Disjoint sets of nodes (union-find) and the edges between them: every edge for paths, data edges for
    growth. Edge sets hold node names that were roots when stored; `find` resolves them."""

    def __init__(self, view: GraphView, order: List[NodeView]):
        self.rank: Dict[str, int] = {node.name: i for i, node in enumerate(order)}
        self.parent: Dict[str, str] = {name: name for name in self.rank}
        self.size: Dict[str, int] = dict.fromkeys(self.rank, 1)
        self.succ: Dict[str, Set[str]] = {name: set() for name in self.rank}
        self.pred: Dict[str, Set[str]] = {name: set() for name in self.rank}
        self.data: Dict[str, Set[str]] = {name: set() for name in self.rank}
        #: root -> the max batch size its nodes are annotated with (None: none is)
        self.cap: Dict[str, Optional[int]] = {node.name: _annotated_max_batch_size(node) for node in order}
        for node in order:
            read = {split_ref(ref)[0] for ref in node.inputs}
            for dep in view.dependencies(node):  # a loop's back edge is no dependency
                self.succ[dep].add(node.name)
                self.pred[node.name].add(dep)
                if dep in read:
                    self.data[dep].add(node.name)

    def find(self, name: str) -> str:
        while self.parent[name] != name:
            self.parent[name] = name = self.parent[self.parent[name]]
        return name

    def grow(self, name: str, candidates: AbstractSet[str]) -> None:
        """Merge into the cluster of `name` the candidate clusters reading it, until none can join."""
        root, grown = self.find(name), True
        while grown:
            grown = False
            users = sorted({self.find(user) for user in self.data[root]} - {root}, key=self.rank.__getitem__)
            for user in users:
                merged = self.contract(root, user) if user in candidates else None
                if merged is not None:
                    root, grown = merged, True

    def contract(self, a: str, b: str) -> Optional[str]:
        """Merge cluster b, which cluster a feeds, into one cluster (its root returned), unless a path other
        than their edges leads from a to b (None)."""
        if None not in (self.cap[a], self.cap[b]) and self.cap[a] != self.cap[b]:
            return None
        lo, hi = self.rank[a], self.rank[b]
        ahead = self._reach(self.succ, a, b, lambda rank: rank < hi)
        if ahead is None:
            return None
        behind = self._reach(self.pred, b, a, lambda rank: rank > lo)
        pool = sorted([lo, hi, *(self.rank[r] for r in ahead | behind)])
        by_rank = lambda roots: sorted(roots, key=self.rank.__getitem__)
        merged = self._union(a, b)
        # What reaches b goes before the merged cluster, what a reaches after it; the rest keeps its rank.
        for root, rank in zip(by_rank(behind) + [merged] + by_rank(ahead), pool):
            self.rank[root] = rank
        return merged

    def _reach(self, edges: Dict[str, Set[str]], start: str, end: str,
               within: Callable[[int], bool]) -> Optional[Set[str]]:
        """The clusters reached from `start` along `edges` (not through `end`, ranks `within`), or None when
        `end` is reached other than by a direct edge."""
        seen: Set[str] = set()
        stack = [start]
        while stack:
            root = stack.pop()
            for name in edges[root]:
                nxt = self.find(name)
                if nxt == end:
                    if root != start:
                        return None
                elif nxt not in seen and nxt != start and within(self.rank[nxt]):
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    def _union(self, a: str, b: str) -> str:
        if self.size[a] < self.size[b]:
            a, b = b, a
        self.parent[b] = a
        self.size[a] += self.size.pop(b)
        cap = self.cap.pop(b)
        self.cap[a] = cap if self.cap[a] is None else self.cap[a]
        del self.rank[b]
        for edges in (self.succ, self.pred, self.data):
            edges[a] = {self.find(name) for name in edges[a] | edges.pop(b)} - {a}
        return a


def _annotated_max_batch_size(node: NodeView) -> Optional[int]:
    attr = node.def_.attr
    return attr[MAX_BATCH_SIZE_ANNOTATION].i if MAX_BATCH_SIZE_ANNOTATION in attr else None
