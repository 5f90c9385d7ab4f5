"""Texts of a ThreadWeaver-style model with plain-text tags, for the corpus
model (:mod:`~tests.support.corpus_model`): what such a model was
trained on, and the settings of ThreadWeaver's SFT orchestrator (pure, no
vLLM import)."""

from __future__ import annotations

#: ThreadWeaver's SFT orchestrator (facebookresearch/threadweaver
#: ``threadweaver_sft/src/simple_eval.py``, ``branching_generate``): "\n"
#: after the threads; a thread without its end tag gets "</Thread>" and the
#: generation stops there.
SFT = {"format": "threadweaver", "merge_suffix": "\n", "child_eos_text": "</Thread>",
       "unclosed_child_stop_text": ""}
#: The digits of the families the corpus holds.
FAMILIES = ("3142", "97", "531", "864201")


def sft_family(digits: str, eos: str = "<|im_end|>") -> tuple[str, list[str]]:
    """A prompt and the texts the model was trained on for it: the whole
    sequential text (ending with ``eos``), then each later thread's own
    sequence (the context through the fork, its header and text, and what
    follows it in the whole text); the first thread's is the whole text."""
    chunks = [digits[i:i + 2] for i in range(0, len(digits), 2)]
    prompt = f"Sort the digits {' '.join(digits)}.\n"
    outline = "".join(f"<Outline>{i}: sort {' '.join(c)}</Outline>\n"
                      for i, c in enumerate(chunks, 1))
    head = prompt + "<Parallel>\n<Outlines>\n" + outline + "</Outlines>"
    threads = [f"<Thread>\n{i}: {' '.join(sorted(c))}</Thread>" for i, c in enumerate(chunks, 1)]
    after = "\n<Conclusion>\n" + " ".join(sorted(digits)) + "\n</Conclusion>\n</Parallel>" + eos
    whole = head + "\n" + "".join(threads) + after
    return prompt, [whole] + [head + "\n" + "".join(threads[i:]) + after
                              for i in range(1, len(threads))]
