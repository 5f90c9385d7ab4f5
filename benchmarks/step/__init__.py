"""Scheduler time per step: one harness, four workloads.

``python -m benchmarks.step --workload NAME [--sizes N ...] [--repeats R]
[--out docs/benchmarks]`` writes ``step_NAME.{md,json}``. Every workload
times the scheduler (``schedule()`` + ``update_from_output()``, and where a
client adds requests, their building and adding) per engine step and per
scheduled request-step, runs its configurations interleaved
(:func:`benchmarks.common.interleaved`) after a discarded warm-up, and
reports medians (``[min–max]`` over repeats where the page shows them):

* ``scheduler`` (:mod:`.scheduler`): no model; the surgical scheduler
  harness of ``tests.support`` drives vLLM's scheduler and the hook
  scheduler at ``--sizes`` live requests (hooks off, on but unused, steady
  fork/join decode, fork/join rounds against the same rounds as a client
  loop over stock);
* ``fair_share`` (:mod:`.fair_share`): no model; a batch of 2 x slots
  fork/join families given at once to ``--sizes`` slots, fair share on and
  off;
* ``engine`` (:mod:`.engine`): the real in-process engine on the quick
  profile's tiny model, scripted tokens, ``--sizes`` fork/join families at
  once, native hooks against the client loop over stock vLLM, and the V1
  model runner's family grouping;
* ``trained`` (:mod:`.trained`): the embedded trained model writing its own
  promises on ``--sizes`` held-out problems at once, native against the
  client loop.
"""

#: The workloads, each a module of this package (``--workload NAME``).
WORKLOADS = ("scheduler", "fair_share", "engine", "trained")
