"""The parts of the fork/join scheduler (``vllm_seqhooks.scheduler``), one
concern each. They are mixins of :class:`vllm_seqhooks.scheduler.SeqHooksMixin`
and share its state; every private vLLM name they use is listed and checked
in ``vllm_seqhooks._vllm_private``.

* :mod:`.state`: the per-request bookkeeping (:class:`~.state.HookState`);
* :mod:`.admission`: hook settings of a request as it is added;
* :mod:`.sampling`: what a request sampled: trimmed to its family's budget,
  scanned for payloads and ``<sync>``, parked;
* :mod:`.spawning`: a closed payload becomes a child request;
* :mod:`.speculative`: several tokens a step, cut at a ``<sync>`` that parks;
* :mod:`.joins`: children's outputs filtered, merged into the parked parent,
  which resumes; the trace of a finished request;
* :mod:`.accounting`: prefill counted at joins and cache hits at forks;
* :mod:`.spill`: parked parents give their KV blocks back when the next
  waiting request cannot get blocks;
* :mod:`.limits`: family budgets, spawn limits and deadlines
  (:mod:`vllm_seqhooks.family` decides);
* :mod:`.fairness`: fair share of slots and KV blocks between families
  (:mod:`vllm_seqhooks.fair_share` decides);
* :mod:`.engine_support`: engines hooks refuse at start-up.
"""
