"""A profile engine: one engine-cache entry serving every input inside an optimization profile.

TensorRT builds one engine per profile that runs any shape between the profile's min and max.
Our engines are specialised to concrete shapes, so a profile engine keeps one specialisation per
input shape it serves, built from the same segment the first time that shape arrives (a row-wise
specialisation also serves smaller batches with equal other dims). The engine cache and the stats
count the entry as one engine; stats count its specialisations apart. Each specialisation records
the profile (``Engine.profile``, saved in its plan), so saved specialisations regroup at load.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Dict, List, Optional, Tuple

from tftrt_py.engine import EngineError
from tftrt_py.engine.profile import OptimizationProfile
from tftrt_py.engine_op.buckets import serving_pool

__all__ = ["ProfileEngine"]

Key = Tuple[Tuple[int, ...], ...]


def _volume(shapes) -> int:
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


class ProfileEngine:
    """Serves the inputs inside `profile`; `specialise(shapes)` builds an engine for concrete shapes."""

    def __init__(self, profile: OptimizationProfile, specialise: Callable[[Key], object]):
        self.profile = profile
        self._specialise = specialise
        self._contexts: "collections.OrderedDict[Key, object]" = collections.OrderedDict()
        self._failed: Dict[Key, str] = {}
        self._profiler = None
        self._lock = threading.RLock()

    def __len__(self):
        return len(self._contexts)

    def can_serve(self, shapes) -> bool:
        return self.profile.contains(shapes)

    @property
    def lookup_cost(self) -> Tuple[int, int]:
        """The engine cache prefers the smallest max volume, then the narrowest profile."""
        high = _volume(self.profile.max)
        return high, high - _volume(self.profile.min)

    def engines(self) -> List[object]:
        with self._lock:
            return [context.engine for context in self._contexts.values()]

    @property
    def copies(self) -> int:
        """The specialisations' copies for smaller batches (see buckets)."""
        with self._lock:
            return sum(context.copies for context in self._contexts.values())

    def add(self, engine) -> object:
        """Keep `engine` (built for shapes inside the profile) as a specialisation; its execution contexts."""
        key = tuple(t.shape for t in engine.inputs)
        with self._lock:
            context = serving_pool(engine)
            context.profiler = self._profiler
            self._contexts[key] = context
            return context

    def context_for(self, shapes: Key):
        """The execution contexts serving `shapes`, specialising first when none does (EngineError if that fails)."""
        return self._entry_for(shapes).context_for(shapes)

    def pending(self, shapes: Key) -> bool:
        """Whether a better pool for `shapes` is being built inside their specialisation (see buckets)."""
        return self._entry_for(shapes).pending(shapes)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Return when the builds started inside the specialisations so far have ended (see buckets), or about
        `timeout` seconds each."""
        with self._lock:
            contexts = list(self._contexts.values())
        for context in contexts:
            context.wait(timeout)

    def _entry_for(self, shapes: Key):
        with self._lock:
            context = self._contexts.get(shapes)
            if context is not None:
                return context
            fits = [k for k, c in self._contexts.items() if c.engine.can_serve(shapes)]
            if fits:
                return self._contexts[min(fits, key=lambda k: (_volume(k), k))]
            if shapes in self._failed:
                raise EngineError(self._failed[shapes])
            try:
                engine = self._specialise(shapes)
            except Exception as exc:  # remembered: the entry serves its other shapes, this one runs natively
                self._failed[shapes] = f"specialising for {[list(s) for s in shapes]} failed: " \
                                       f"{type(exc).__name__}: {exc}"
                raise EngineError(self._failed[shapes]) from exc
            return self.add(engine)

    @property
    def profiler(self):
        return self._profiler

    @profiler.setter
    def profiler(self, profiler) -> None:
        with self._lock:
            self._profiler = profiler
            for context in self._contexts.values():
                context.profiler = profiler
