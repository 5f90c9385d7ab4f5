"""The vLLM adapter: the only code that knows vLLM's internals.

It applies what the pure packages decide. :mod:`.scheduler` holds every vLLM
scheduler method the hooks override, each reading top to bottom; the parts it
calls are named after their concern (:mod:`.admission`, :mod:`.sampling`,
:mod:`.parking`, :mod:`.spawning`, :mod:`.speculative`, :mod:`.joins`,
:mod:`.step_outputs`, :mod:`.kv_pressure`, :mod:`.family_limits`,
:mod:`.fair_share`, :mod:`.accounting`, :mod:`.splicing`); each is built with
what it reads (the :class:`~.state.ForkJoinState`, the settings, the metrics)
and the parts it calls, and reaches vLLM's scheduler only through
:class:`~.vllm_private.scheduler_port.SchedulerPort`; each request's phase
changes only through :class:`~.lifecycle.Lifecycle`. :mod:`.vllm_private`
names every private vLLM API used and checks it; :mod:`.patches` installs every patch of vLLM's classes;
:mod:`.validation` checks requests at admission; :mod:`.worker` is the worker
extension; :mod:`.metrics` exports counters.

Importing this package does not import vLLM: it only names the classes vLLM
is given.
"""

#: ``scheduler_cls`` of engines with hooks.
SCHEDULER_CLASS_PATH = "vllm_seqhooks.engine.scheduler.SeqHooksScheduler"
#: ``worker_extension_cls`` of engines with hooks: vLLM imports it in each
#: worker process, which installs the worker-side patches there.
WORKER_EXTENSION_CLASS_PATH = "vllm_seqhooks.engine.worker.SeqHooksWorkerExtension"
