"""Speed at GPU scale on a CPU: a GPU-timed engine (issue 52).

vLLM's real frontend, engine core, scheduler (stock or hooks), async
scheduling and a worker process, where each step's forward pass is a wait
as long as a named GPU would take for a named model, and no model runs:

* :mod:`.step_model`: the roofline that prices a step; :mod:`.profiles`:
  the named GPUs, models and the calibration (sources on
  docs/benchmarks/gpu_timed.md);
* :mod:`.tracker`: what the worker's "model" samples (each request's
  scripted tokens) and what each step computes, from the scheduler outputs;
* :mod:`.worker`: the ``worker_cls`` (vLLM's CPU worker with the two step
  methods answered by a modelled GPU); :mod:`.engine_args`: the engine
  arguments that select it; :mod:`.serve`: ``vllm serve`` on it;
* :mod:`.stats_file`: the counters files both write;
* :mod:`.timed_scheduler`: the scheduler's calls timed in the engine core
  (thread CPU; the process's CPU time counts vLLM's busy-polling);
* :mod:`.traces`: parallel-reasoning traces in ThreadWeaver's format with
  ThreadWeaver's published lengths;
* :mod:`.families`: those traces on one GPU-timed engine, in-process
  (native, sequential, the in-process loop): the first piece of the grid;
* :mod:`.plain_pairs`: plain traffic on many fresh pairs of servers (stock,
  hooks), what one pair in the grid cannot resolve.
"""
