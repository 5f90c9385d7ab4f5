"""The parts of the fork/join scheduler (``vllm_seqhooks.scheduler``), one
concern each. They are mixins of :class:`vllm_seqhooks.scheduler.SeqHooksMixin`
and share its state; every private vLLM name they use is listed and checked
in ``vllm_seqhooks._vllm_private``.

* :mod:`.state`: the per-request bookkeeping (:class:`~.state.HookState`);
* :mod:`.admission`: hook settings of a request as it is added;
* :mod:`.spawning`: a closed payload becomes a child request;
* :mod:`.speculative`: several tokens a step, cut at a ``<sync>`` that parks;
* :mod:`.joins`: children's outputs filtered, merged into the parked parent,
  which resumes; the trace of a finished request;
* :mod:`.accounting`: prefill counted at joins and cache hits at forks;
* :mod:`.spill`: parked parents give their KV blocks back under pressure;
* :mod:`.engine_support`: engines hooks refuse at start-up.
"""
