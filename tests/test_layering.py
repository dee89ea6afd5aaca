"""The package's imports point one way, down the data flow, and never in a circle.

Layers, top to bottom (a module imports from its own layer or below):
tools, serving -> trt_convert and the converter classes (converters) -> segmenter, engine_op -> the TF-graph lowering
(convert) -> calibration -> engine -> settings, logging. Imports inside functions count as much as those at the top:
deferring an import must not hide a circle.
"""
from __future__ import annotations

import ast
import os
from typing import Dict, Set

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tftrt_py")

LAYERS = [
    ("tftrt_py.tools", "tftrt_py.serving"),
    ("tftrt_py.trt_convert", "tftrt_py.converters"),
    ("tftrt_py.segmenter", "tftrt_py.engine_op"),
    ("tftrt_py.convert",),
    ("tftrt_py.calibration",),
    ("tftrt_py.engine",),
    ("tftrt_py.settings", "tftrt_py.logging_config", "tftrt_py"),
]


def modules() -> Dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "tftrt_py." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module[:-len(".__init__")] if module.endswith(".__init__") else module] = path
    return found


def imports(mods: Dict[str, str]) -> Dict[str, Set[str]]:
    """module -> the tftrt_py modules it imports, anywhere in its body."""
    graph = {}
    for module, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                # `from package import module` imports that module; `from module import name`, the module
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods and "." in name:
                    name = name.rpartition(".")[0]
                if name in mods and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def layer_of(module: str) -> int:
    best = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (index, len(prefix))
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best[0]


def circles(graph: Dict[str, Set[str]]):
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circles():
    assert circles(imports(modules())) == []


def test_imports_point_down_the_data_flow():
    graph = imports(modules())
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer_of(t) < layer_of(m))
    assert upward == [], "imports up the layers:\n" + "\n".join(upward)
