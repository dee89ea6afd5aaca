"""Prometheus metrics of one server (its own registry): requests by model, API and status, latency, batch sizes,
queue depth, and the engine ops' counters (hits, builds, native-segment fallbacks) read from the dispatcher."""
from __future__ import annotations

from typing import Callable, Dict

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["Metrics", "CONTENT_TYPE"]

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
#: engine op counters exported, each as tftrt_engine_op_<name>_total{engine_op}
ENGINE_COUNTERS = {"hits": "engine cache hits", "builds": "engines built", "build_failures": "failed engine builds",
                   "engine_runs": "runs on an engine", "fallback_total": "runs of the native segment (fallbacks)"}


class _EngineOpCollector:
    """Reads tftrt_py.engine_op.dispatcher.stats() at each scrape."""

    def collect(self):
        from tftrt_py.engine_op import dispatcher

        stats = dispatcher.stats()
        for key, help_text in ENGINE_COUNTERS.items():
            name = f"tftrt_engine_op_{key.removesuffix('_total')}"
            family = CounterMetricFamily(name, help_text, labels=["engine_op"])
            for op, values in stats.items():
                family.add_metric([op], values[key])
            yield family
        engines = GaugeMetricFamily("tftrt_engine_op_engines", "engines cached", labels=["engine_op"])
        for name, values in stats.items():
            engines.add_metric([name], values["engines"])
        yield engines


class Metrics:
    """The server's metrics; `queue_depths()` gives waiting requests by model at scrape time."""

    def __init__(self, queue_depths: Callable[[], Dict[str, int]] = dict):
        self.registry = CollectorRegistry()
        self.requests = Counter("tftrt_serving_requests", "requests by model, API and status code",
                                ["model", "api", "status"], registry=self.registry)
        self.latency = Histogram("tftrt_serving_request_latency_seconds", "request latency (receipt to answer)",
                                 ["model", "api"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("tftrt_serving_batch_size", "rows of each batch run (before padding)",
                                    ["model"], buckets=BATCH_BUCKETS, registry=self.registry)
        self.padded_rows = Counter("tftrt_serving_padding_rows", "rows added to batches to reach an allowed size",
                                   ["model"], registry=self.registry)
        self._depth = Gauge("tftrt_serving_queue_depth", "requests waiting in batch queues", ["model"],
                            registry=self.registry)
        self._queue_depths = queue_depths
        self._request_series: Dict[tuple, tuple] = {}  # (model, api, status) -> (count, latency): labels() once
        self.registry.register(_EngineOpCollector())

    def observe_request(self, model: str, api: str, status: str, seconds: float) -> None:
        series = self._request_series.get((model, api, status))
        if series is None:
            series = self._request_series.setdefault((model, api, status), (
                self.requests.labels(model, api, status), self.latency.labels(model, api)))
        series[0].inc()
        series[1].observe(seconds)

    def observe_batch(self, model: str, rows: int, padded: int) -> None:
        self.batch_size.labels(model).observe(rows)
        if padded > rows:
            self.padded_rows.labels(model).inc(padded - rows)

    def exposition(self) -> bytes:
        """The text exposition format, queue depths read now."""
        for model, depth in self._queue_depths().items():
            self._depth.labels(model).set(depth)
        return generate_latest(self.registry)
