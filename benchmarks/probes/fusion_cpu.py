"""Keras ResNet50 (weights=None) on the numpy backend, built with and without the fusion passes.

    python benchmarks/probes/fusion_cpu.py [--batch 8] [--size 96] [--runs 10]

Both engines keep constant folding and dead-layer elimination. Prints each engine's layer
count, the fusions applied, the median CPU latency of each (runs interleaved) and the speed-up.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.sample_models import build_keras_application  # noqa: E402
from tftrt_py.convert.build import SegmentGraph, network_from_segment  # noqa: E402
from tftrt_py.convert.graph import GraphView  # noqa: E402
from tftrt_py.converters import graph_io  # noqa: E402
from tftrt_py.engine import Builder, builder  # noqa: E402
from tftrt_py.engine.builder.fusions.match import fusion_counts  # noqa: E402
from tftrt_py.segmenter import segment_graph  # noqa: E402

BASE_PASSES = ("constant folding", "dead-layer elimination")


def resnet50_segment(batch: int, size: int):
    """(segment, Keras model) for ResNet50 frozen and grappler-optimized at [batch, size, size, 3]."""
    model, _ = build_keras_application("resnet50", size=size)
    frozen = graph_io.freeze(tf.function(model).get_concrete_function(tf.TensorSpec((batch, size, size, 3))))
    inputs, outputs = [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]
    view = GraphView(graph_io.optimize(frozen.graph.as_graph_def(), frozen.graph, inputs + outputs))
    segments = segment_graph(view, fetches=outputs).segments
    if len(segments) != 1:
        raise SystemExit(f"expected one segment, got {len(segments)}")
    return SegmentGraph.from_graph_def(segments[0].graph_def(view)), model


def build(segment, shape, fused: bool):
    network = network_from_segment(segment, [shape], name="resnet50")
    converted = len(network.layers)
    pipeline = builder.PIPELINE if fused else [p for p in builder.PIPELINE if p[0] in BASE_PASSES]
    with mock.patch.object(builder, "PIPELINE", pipeline):
        return converted, Builder().build_engine(network)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    shape = (args.batch, args.size, args.size, 3)
    segment, model = resnet50_segment(args.batch, args.size)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = model(x).numpy()
    engines = {}
    for label, fused in (("unfused", False), ("fused", True)):
        converted, engine = build(segment, shape, fused)
        got = engine.create_execution_context().execute_v2([x])[0]
        kinds = collections.Counter(l.kind for l in engine.network.layers)
        print(f"{label:8s} {converted} layers converted -> {len(engine.network.layers)} after the builder "
              f"({', '.join(f'{n} {k}' for k, n in kinds.most_common())}); max |engine - Keras| "
              f"{np.abs(got - want).max():.2e}")
        engines[label] = engine
    print("fusions:", ", ".join(f"{n} x {rule}" for rule, n in sorted(fusion_counts(engines["fused"].network).items())))
    contexts = {label: e.create_execution_context() for label, e in engines.items()}
    times = {label: [] for label in engines}
    for _ in range(args.runs):  # interleaved, so load on the machine hits both alike
        for label, ctx in contexts.items():
            start = time.perf_counter()
            ctx.execute_v2([x])
            times[label].append((time.perf_counter() - start) * 1e3)
    medians = {label: statistics.median(t) for label, t in times.items()}
    for label, ms in medians.items():
        print(f"{label:8s} median latency {ms:7.1f} ms over {args.runs} runs (batch {args.batch}, numpy backend)")
    print(f"speed-up {medians['unfused'] / medians['fused']:.2f}x")


if __name__ == "__main__":
    main()
