"""Step a ``vllm.LLM``'s engine by hand: requests are added the moment their
sender knows them, between two engine steps.

``LLM.generate`` adds every request, then steps the engine until they are
done; a client that reacts to outputs (the event-driven client loop, a
benchmark timing the native engine the same way) needs the same loop with a
callback: :func:`drive`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

#: A request to add: ``(request_id, prompt token ids, SamplingParams)``.
NewRequest = tuple[str, Sequence[int], Any]


def engine_input(llm: Any, prompt_ids: Sequence[int]) -> Any:
    """The engine input ``LLM.generate`` would build for a token prompt."""
    prompt = {"prompt_token_ids": list(prompt_ids)}
    render = getattr(llm, "_preprocess_cmpl_one", None)
    return render(prompt) if render is not None else prompt


def drive(llm: Any, initial: Iterable[NewRequest],
          on_output: Callable[[Any], Iterable[NewRequest] | None],
          timeout_s: float | None = None) -> float:
    """Add ``initial``, then step ``llm``'s engine until nothing is left;
    every ``RequestOutput`` goes to ``on_output``, whose requests are added
    before the next step. Returns the wall seconds. Past ``timeout_s``
    (None: no limit) what is left is aborted and ``TimeoutError`` raised."""
    engine = llm.llm_engine
    t0 = time.perf_counter()
    added: list[str] = []

    def add(requests: Iterable[NewRequest] | None) -> None:
        for rid, ids, sp in requests or ():
            engine.add_request(rid, engine_input(llm, ids), sp)
            added.append(rid)

    add(initial)
    while engine.has_unfinished_requests():
        for out in engine.step():
            add(on_output(out))
        if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
            engine.abort_request(added)
            while engine.has_unfinished_requests():
                engine.step()
            raise TimeoutError(f"engine still busy after {timeout_s:.0f} s")
    return time.perf_counter() - t0
