"""Seeded requests whose prefill spans several steps, on vLLM's V1 model
runner on CPU.

vLLM 0.32's V1 runner samples a token for every request of a step, also
for one whose prefill is not done (its sample is discarded), and then
rewinds that request's seeded generator with ``Generator.set_offset``. CPU
generators have no offset: the step raises ``RuntimeError: CPU Generator
does not use offset`` (stock vLLM too: one seeded prompt longer than
``max_num_batched_tokens`` is enough). With hooks every child prompt and
every join's merge is a prefill that may be split, and children of a
seeded request are seeded, so an engine with hooks meets it much more
often.

The fix keeps what the rewind is for: a discarded sample must not move
the request's seeded stream. For the step's requests whose sample is
discarded, their CPU generators are taken out of the batch's generators
(which the step's sampling metadata shares) before sampling and put back
after the bookkeeping: they sample from the global generator, their token
is thrown away as before, and the rewind finds nothing to rewind. CUDA
generators are left as they are. The V2 runner's sampling is stateless
(seed and position), nothing to do there.
"""

from __future__ import annotations

import inspect
import logging

from vllm_seqhooks.engine.vllm_private.common import method_problems, wrap_method

V1_SEEDED_METHODS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("_sample", ("self", "logits", "spec_decode_metadata")),
    ("_bookkeeping_sync", ("self", "scheduler_output", "sampler_output", "logits",
                           "hidden_states", "num_scheduled_tokens")),
)
_MARK = "_seqhooks_cpu_seeds"
#: Runner attribute: the generators taken out for this step.
_HELD = "_seqhooks_held_generators"


def cpu_seed_problems() -> list[str]:
    """What :func:`install_cpu_seed_fix` relies on in the V1 runner."""
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    found = method_problems(GPUModelRunner, V1_SEEDED_METHODS)
    if "gen.set_offset(gen.get_offset() - 4)" not in inspect.getsource(
            GPUModelRunner._bookkeeping_sync):
        found.append("GPUModelRunner._bookkeeping_sync no longer rewinds generators by offset")
    if "generators=self.generators" not in inspect.getsource(
            InputBatch._make_sampling_metadata):
        found.append("InputBatch's sampling metadata no longer shares its generators dict")
    return found


def _take_discarded(runner) -> None:
    batch = runner.input_batch
    num_reqs = batch.num_reqs
    held = {}
    for i in runner.discard_request_mask.np[:num_reqs].nonzero()[0]:
        gen = batch.generators.get(int(i))
        if gen is not None and gen.device.type == "cpu":
            held[int(i)] = batch.generators.pop(int(i))
    if held:
        runner.__dict__[_HELD] = held


def _give_back(runner) -> None:
    held = runner.__dict__.pop(_HELD, None)
    if held:
        runner.input_batch.generators.update(held)


def install_cpu_seed_fix() -> bool:
    """Install the fix in the V1 runner (once per process); False (logged)
    when the installed vLLM lacks what it wraps."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if getattr(GPUModelRunner._sample, _MARK, False):
        return True
    found = cpu_seed_problems()
    if found:
        logging.getLogger("vllm.seqhooks").error(
            "vllm-seqhooks: seeded requests with split prefills may fail on CPU: %s",
            "; ".join(found))
        return False
    sample, bookkeeping = GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync

    def _sample(self, *args, **kwargs):
        if self.input_batch.generators:
            _take_discarded(self)
        try:
            return sample(self, *args, **kwargs)
        except BaseException:
            _give_back(self)
            raise

    def _bookkeeping_sync(self, *args, **kwargs):
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            _give_back(self)

    wrap_method(GPUModelRunner, "_sample", _sample, _MARK)
    wrap_method(GPUModelRunner, "_bookkeeping_sync", _bookkeeping_sync, _MARK)
    return True
