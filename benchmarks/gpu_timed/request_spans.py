"""How long each request took as the engine saw it: from the start of the
first modelled step that scheduled it to the end of its last one (wall
clock, so times the time scale). The grid compares them with what its
client saw (:func:`.time_scale.client_lag`): a client that saw its requests
finish much later than the engine finished them measured its host, not the
GPU. Pure."""

from __future__ import annotations

from collections.abc import Iterable


class RequestSpans:
    def __init__(self) -> None:
        self._spans: dict[str, list[float]] = {}

    def step(self, req_ids: Iterable[str], start: float, end: float) -> None:
        for rid in req_ids:
            span = self._spans.get(rid)
            if span is None:
                self._spans[rid] = [start, end]
            else:
                span[1] = end

    def take(self) -> list[float]:
        """Every request's span since the last call (the requests of the
        runs in between: call it before and after the one of interest)."""
        spans, self._spans = self._spans, {}
        return [end - start for start, end in spans.values()]
