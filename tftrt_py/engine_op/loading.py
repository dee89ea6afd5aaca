"""Engines an engine op restores instead of building: the plan in its node's ``serialized_segment`` and the engines
saved with its model as SavedModel assets. Engines from files must carry the op's binding digest
(engine_op.binding), so a foreign or forged plan is refused; a plan or file that cannot be read is logged and skipped,
and the op builds or runs natively as it would without it."""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from google.protobuf.message import DecodeError
from tensorflow.core.framework import graph_pb2

from tftrt_py.convert.build import INPUT_PREFIX, SegmentGraph
from tftrt_py.engine import EngineError, Runtime
from tftrt_py.engine_op.cache import read_asset, unpack_plans

__all__ = ["add_plan", "load_assets", "segment_from_serialized"]

logger = logging.getLogger(__name__)


def add_plan(op, plan: bytes, source: str) -> None:
    """Put a serialized engine into `op`'s cache (a bad plan, or one built for another segment, is logged and
    skipped). Engines from files must carry the op's binding; the node's own serialized_segment need not."""
    try:
        engine = Runtime(backend=op.backend).deserialize_cuda_engine(plan)
    except EngineError as exc:
        logger.error("%s: ignoring engine from %s: %s", op.name, source, exc)
        return
    if source != "serialized_segment" and engine.binding != op.binding:
        logger.error("%s: ignoring engine from %s: it was built for another segment, bindings or precision "
                     "(digest %s, this op's is %s)", op.name, source, engine.binding, op.binding)
        return
    with op.lock:
        if getattr(engine, "profile", None) is None:
            op.insert(tuple(t.shape for t in engine.inputs), engine)
            return
        key = engine.profile.key
        if key not in op.cache.keys():
            op.insert(key, op.profile_engine(engine.profile))
        op.cache.get(key).add(engine)


def load_assets(op, assets: Sequence[bytes]) -> None:
    """Restore into `op` the engines saved in `assets` (paths). The assets of the op's first run with assets are its
    own: a kernel of another model naming this op's segment function (so sharing the op) cannot add engines to it."""
    paths = [path.decode() if isinstance(path, bytes) else str(path) for path in assets]
    if op.asset_paths is None and paths:  # once: the lock stays off the per-call path
        with op.lock:
            if op.asset_paths is None:
                op.asset_paths = set(paths)
    for path in paths:
        if path in op.loaded_assets:
            continue
        op.loaded_assets.add(path)
        if path not in op.asset_paths:
            logger.error("%s: ignoring engines from %s: this op serves the engines saved with its model (%s); "
                         "another model's engine op names its native segment function", op.name, path,
                         ", ".join(sorted(op.asset_paths)))
            continue
        try:
            plans = unpack_plans(read_asset(path))
        except EngineError as exc:
            logger.error("%s: cannot read saved engines, building or running natively as without them: %s",
                         op.name, exc)
            continue
        for plan in plans:
            add_plan(op, plan, source=path)
        logger.info("%s: restored %d engine(s) from %s", op.name, len(plans), path)


def segment_from_serialized(data: bytes) -> Optional[SegmentGraph]:
    """The segment a serialized segment GraphDef holds (TF-TRT 1.x's dynamic ops without function backup), or None
    when `data` is not one."""
    try:
        graph_def = graph_pb2.GraphDef.FromString(data)
    except DecodeError:
        return None
    if not any(n.name.startswith(INPUT_PREFIX) for n in graph_def.node):
        return None
    return SegmentGraph.from_graph_def(graph_def)
