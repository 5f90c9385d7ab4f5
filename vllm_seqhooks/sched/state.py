"""Per-request fork/join bookkeeping kept by the scheduler."""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.request import Request, RequestStatus

from vllm_seqhooks.dependencies import JoinRecord
from vllm_seqhooks.family import FamilyLedger
from vllm_seqhooks.formats import TagFormatScanner
from vllm_seqhooks.tokens import SpecialTokenProcessor


@dataclass
class HookState:
    """What the scheduler keeps for one request with hooks."""

    request: Request
    scanner: SpecialTokenProcessor | TagFormatScanner | None
    orig_prompt_len: int
    orig_max_tokens: int
    orig_min_tokens: int
    sampled: int = 0
    #: Set while the request is parked because it finished with open children
    #: (rule 5): the status it finishes with once they are merged.
    final_status: RequestStatus | None = None
    final_stop_reason: int | str | None = None
    #: Position of the token that stopped the request (EOS / stop token).
    stop_pos: int | None = None
    parked: bool = False
    spilled_frontier: int | None = None
    #: The join whose prefill is being counted, until the parent samples.
    accounting: JoinRecord | None = None
    first_scheduled: bool = False
    preempted_at_stop: bool = False
    child_max_tokens: int | None = None
    separator: tuple[int, ...] = ()
    #: The limits of the family this request belongs to (None: no limits,
    #: the request cannot spawn).
    family: FamilyLedger | None = None
    #: A child of a tag format that stopped at its end tag.
    ended_by_tag: bool = False
