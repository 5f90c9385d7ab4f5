"""The attention masks and position ids parallel-reasoning trainers build,
re-implemented here from reading their code, to check a splice join
against (:mod:`vllm_seqhooks.core.splice_layout`).

- :func:`multiverse_training_layout` follows Infini-AI-Lab/Multiverse
  ``train/utils.py``: ``generate_multiverse_attention_mask`` (inside each
  ``<Parallel>`` block, the spans ``<Path>`` ... ``</Path>`` (tags included)
  that block directly holds are hidden from each other; everything else is
  causal) and ``generate_multiverse_position_ids`` (in a block, ``<Path>``
  restarts at the position of ``</Goal>`` + 1; ``</Path>`` records the
  path's extent; ``<Conclusion>`` restarts at ``</Goal>`` + the longest
  extent + 1; the tokens after a restart count on from it).
- :func:`npr_training_layout` follows bigai-nlco/Native-Parallel-Reasoner
  ``npr-rl/verl/workers/actor/mv_utils.py``:
  ``generate_parallel_attention_mask`` (after the first ``<|im_end|>``, the
  ``<step>`` ... ``</step>`` spans written since the last ``<takeaway>``
  are hidden from each other when a ``<takeaway>`` comes; nested steps are
  an error) and ``generate_parallel_position_ids`` (``<step>`` restarts at
  ``</guideline>`` + 1, ``<takeaway>`` at ``</guideline>`` + the longest
  step + 1).

- :func:`parallel_r1_training_layout` follows zhengkid/Parallel-R1 (read at
  7c3a8f3) ``verl/verl/utils/dataset/parallel_thinking_sft_dataset.py``,
  ``ParallelThinkingSFTDataset``: ``generate_parallel_thinking_reasponse_mask``
  (the ``<Path>`` ... ``</Path>`` spans of a ``<Parallel>`` block, tags
  included, hidden from each other once ``</Parallel>`` closes the block;
  everything else causal) and ``compute_structured_position_ids``
  (``<Path>`` restarts at the position of ``<Parallel>`` + 1,
  ``</Parallel>`` goes on at ``<Parallel>`` + the longest path + 1; tokens
  inside a block but outside every path keep position 0). Its RL actor
  (``dp_actor.py``, spans from ``parallel_thinking_loop_v3.py``) gives the
  same for the two paths it supports.

All work on token ids with single-token tags, as the trainers do; each
returns ``(mask, positions)`` with ``mask[i][j]`` True where token ``i``
attends to token ``j``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Mask = list[list[bool]]


def _causal(n: int) -> Mask:
    return [[j <= i for j in range(n)] for i in range(n)]


def _hide_from_each_other(mask: Mask, spans: Sequence[tuple[int, int]]) -> None:
    for a, (start_a, end_a) in enumerate(spans):
        for start_b, end_b in spans[a + 1:]:
            for i in range(start_b, end_b):
                for j in range(start_a, end_a):
                    mask[i][j] = False


def multiverse_training_layout(ids: Sequence[int], tag: Mapping[str, int]) -> tuple[Mask, list[int]]:
    """``tag``: the ids of ``Parallel``, ``/Parallel``, ``Goal``, ``/Goal``,
    ``Path``, ``/Path``, ``Conclusion``, ``/Conclusion``."""
    mask = _causal(len(ids))
    blocks: list[list[tuple[int, int]]] = []  # each open <Parallel>: its path spans
    open_paths: list[int] = []
    for i, token in enumerate(ids):
        if token == tag["Parallel"]:
            blocks.append([])
        elif token == tag["Path"]:
            open_paths.append(i)
        elif token == tag["/Path"]:
            blocks[-1].append((open_paths.pop(), i + 1))
        elif token == tag["/Parallel"]:
            _hide_from_each_other(mask, blocks.pop())
    if blocks or open_paths:
        raise ValueError("unclosed <Parallel> or <Path>")

    out: list[int] = []
    states: list[dict] = []  # each open <Parallel>: goal end, longest path, flags
    position = 0
    for token in ids:
        state = states[-1] if states else None
        if token == tag["Parallel"]:
            states.append({"goal_end": None, "longest": 0, "in_goal": False, "in_path": False})
        elif state is not None and token == tag["Goal"]:
            state["in_goal"] = True
        elif state is not None and token == tag["Path"] and state["goal_end"] is not None:
            state["in_path"] = True
            position = state["goal_end"] + 1
        elif state is not None and token == tag["Conclusion"] and state["goal_end"] is not None:
            position = state["goal_end"] + state["longest"] + 1
        elif token == tag["/Parallel"] and states:
            states.pop()
        out.append(position)
        if state is not None and token == tag["/Goal"] and state["in_goal"]:
            state["goal_end"], state["in_goal"] = position, False
        elif state is not None and token == tag["/Path"] and state["in_path"]:
            state["longest"] = max(state["longest"], position - state["goal_end"])
            state["in_path"] = False
        position += 1
    return mask, out


def npr_training_layout(ids: Sequence[int], tag: Mapping[str, int]) -> tuple[Mask, list[int]]:
    """``tag``: the ids of ``im_end``, ``guideline``, ``/guideline``,
    ``step``, ``/step``, ``takeaway``. Raises ValueError where the trainer
    rejects the sequence (a step inside a step, one left open)."""
    mask = _causal(len(ids))
    first = list(ids).index(tag["im_end"]) + 1
    spans: list[tuple[int, int]] = []
    open_step: int | None = None
    for i in range(first, len(ids)):
        if ids[i] == tag["step"]:
            if open_step is not None:
                raise ValueError("a step inside a step")
            open_step = i
        elif ids[i] == tag["/step"]:
            if open_step is None:
                raise ValueError("</step> without <step>")
            spans.append((open_step, i + 1))
            open_step = None
        elif ids[i] == tag["takeaway"]:
            if open_step is not None:
                raise ValueError("<takeaway> inside a step")
            _hide_from_each_other(mask, spans)
            spans = []
    if open_step is not None:
        raise ValueError("a step left open")

    out = list(range(first))
    states: list[dict] = []
    position = first
    for token in ids[first:]:
        state = states[-1] if states else None
        if token == tag["guideline"]:
            states.append({"goal_end": None, "longest": 0, "in_goal": True, "in_step": False})
        elif state is not None and token == tag["step"] and state["goal_end"] is not None:
            state["in_step"] = True
            position = state["goal_end"] + 1
        elif state is not None and token == tag["takeaway"] and state["goal_end"] is not None:
            position = state["goal_end"] + state["longest"] + 1
            states.pop()
        out.append(position)
        if state is not None and token == tag["/guideline"] and state["in_goal"]:
            state["goal_end"], state["in_goal"] = position, False
        elif state is not None and token == tag["/step"] and state["in_step"]:
            state["longest"] = max(state["longest"], position - state["goal_end"])
            state["in_step"] = False
        position += 1
    if states:
        raise ValueError("a guideline block left open")
    return mask, out


def parallel_r1_training_layout(ids: Sequence[int],
                                tag: Mapping[str, int]) -> tuple[Mask, list[int]]:
    """``tag``: the ids of ``Parallel``, ``/Parallel``, ``Path``, ``/Path``.
    Raises ValueError on a block left open or a path outside a block."""
    mask = _causal(len(ids))
    out: list[int] = []
    block: dict | None = None
    position = 0
    for i, token in enumerate(ids):
        if token == tag["Parallel"]:
            if block is not None:
                raise ValueError("a <Parallel> block inside another")
            block = {"start": position, "spans": [], "open": None, "longest": 0}
            out.append(position)
            position += 1
            continue
        if block is None:
            if token in (tag["Path"], tag["/Path"], tag["/Parallel"]):
                raise ValueError("a path tag outside a <Parallel> block")
            out.append(position)
            position += 1
            continue
        if token == tag["Path"]:
            block["open"] = i
            position = block["start"] + 1
        elif token == tag["/Parallel"]:
            _hide_from_each_other(mask, block["spans"])
            position = block["start"] + block["longest"] + 1
            out.append(position)
            position += 1
            block = None
            continue
        if block["open"] is None:
            out.append(0)  # inside the block, outside every path
            continue
        out.append(position)
        if token == tag["/Path"]:
            block["spans"].append((block["open"], i + 1))
            block["longest"] = max(block["longest"], i + 1 - block["open"])
            block["open"] = None
        position += 1
    if block is not None:
        raise ValueError("a <Parallel> block left open")
    return mask, out
