"""A faster host than this one, modelled by slowing the modelled GPU.

Where the GPU's step is shorter than the host needs to feed it (1.5B at 256
families: about 4 ms a step for 256 streams, which this 2-core machine's
API server, client and engine core do not turn around in time), a run
measures the host, and two runs of the same work differ by how the host fell
behind (the A/A at 1.5B and 256 families: 1.262 in the grid of 2026-11-29;
0.95 on a slower host of this class on 2026-12-04). A host ``k`` times as
fast has ``k`` times the wall time for the same step; so the engine's steps
wait ``k`` times their modelled time (the worker's ``set_time_scale``) and
the run's times are divided by ``k`` back into modelled seconds. What this
host's CPU does is not scaled: the scheduler's CPU per step is still
compared with the modelled (unscaled) step, so "fits the step" is this
host's, not the faster one's.

The grid chooses ``k`` per size (:func:`next_scale`): from the previous
size's (or 1), doubled while the size's first run (``sequential``: stock
vLLM, one request per family) shows the host behind, up to
:data:`MAX_SCALE`, in either of two ways:

* the modelled GPU idle for more than 2 % of the run's wall time
  (:func:`busy_fraction`): the engine or the clients did not keep it fed;
* the client's p50 family latency more than 3 % above the p50 of the
  requests' spans on the modelled GPU (:func:`client_lag`,
  :mod:`.request_spans`): the GPU was kept busy, but the client saw its
  requests finish late (its API server fell behind the engine's outputs, or
  took long to hand it the requests). The grid of 2026-11-29 had the GPU
  99 % busy at 1.5B and 256 families and its p50 1.6 times what a host that
  keeps up measures.

Every configuration of the size then runs at that scale, so the ratios
compare runs at one scale. The loop is not what chooses it: its round
trips leave a GPU idle on any host.
"""

from __future__ import annotations

import statistics

from benchmarks.gpu_timed.worker_rpc import call

BUSY_AT_LEAST = 0.98
LAG_AT_MOST = 1.03
MAX_SCALE = 8


def busy_fraction(modelled_gpu_s: float, wall_s: float, scale: float) -> float:
    """The share of a run's wall time the modelled GPU was busy."""
    return modelled_gpu_s * scale / wall_s if wall_s > 0 else 1.0


def client_lag(client_p50_s: float, engine_spans_s: list[float], scale: float) -> float:
    """The client's p50 latency (modelled seconds) over the p50 of the
    requests' spans on the modelled GPU (wall seconds, divided by
    ``scale``)."""
    engine = statistics.median(engine_spans_s) / scale if engine_spans_s else 0.0
    return client_p50_s / engine if engine > 0 else 1.0


def next_scale(scale: float, busy: float, lag: float) -> float | None:
    """The scale to try after a run at ``scale`` whose GPU was ``busy`` that
    share of the time and whose client saw ``lag`` times the engine's p50:
    None when the host kept up (or the largest scale was reached: the size
    then runs at it, and its rows say the host fell behind)."""
    if (busy >= BUSY_AT_LEAST and lag <= LAG_AT_MOST) or scale >= MAX_SCALE:
        return None
    return min(MAX_SCALE, 2 * scale)


def set_scale(engine, scale: float) -> None:
    """Every later step of ``engine`` (a server's URL or an in-process
    ``LLM``) waits ``scale`` times its modelled time."""
    results = [float(x) for x in call(engine, "set_time_scale", scale)]
    if results != [float(scale)]:
        raise RuntimeError(f"the time scale was not set to {scale} ({results!r})")


def take_spans(engine) -> list[float]:
    """The request spans ``engine``'s worker recorded since the last call."""
    (spans,) = call(engine, "take_request_spans")
    return spans
