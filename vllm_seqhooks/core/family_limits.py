"""The limits of one request's family (the request and all its descendants),
and the ledger that enforces them.

Pure Python, no vLLM import. The scheduler asks the ledger whether a
promise may spawn a child, how many of the tokens a descendant just sampled
it may keep, and whether the family has run out (of tokens or of time); it
applies the answers. What happens at each limit:

* ``max_descendants``, ``max_live_children_per_family``, the engine's
  ``max_live_children``, a spent token budget or a passed family deadline at
  a promise: the promise stays plain text (``ignored_promises`` in the
  trace, with the reason);
* the token budget runs out while descendants run: every descendant is cut
  as if it had reached its ``max_tokens`` (finish reason ``length``; what it
  wrote is merged), parents parked on them join and finish the same way, and
  the request itself continues on its own ``max_tokens``, which the budget
  reserved for it;
* a child's deadline passes: the child fails (reason ``timeout``; the failed
  marker is merged, if configured) and its parent resumes;
* the family's deadline passes: descendants are cut as for the token budget,
  and the request itself finishes with what it has (``length``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Why a promise spawned no child / why a family stopped (trace and logs).
DESCENDANTS = "max_descendants"
FAMILY_LIVE = "family_live_children"
ENGINE_LIVE = "engine_live_children"
#: Refusals that pass once children end (the live-children limits): a tag
#: format's fork defers its children past them rather than dropping them.
TRANSIENT_REFUSALS = frozenset({FAMILY_LIVE, ENGINE_LIVE})
TOKEN_BUDGET = "family_token_budget"
DEADLINE = "family_deadline"
CHILD_TIMEOUT = "timeout"


@dataclass(frozen=True)
class FamilyLimits:
    #: Tokens the request and all its descendants may sample together.
    token_budget: int
    #: Of which the request's own max_tokens, reserved for it.
    root_max_tokens: int
    max_descendants: int
    max_live_children: int
    #: Seconds from the request's arrival after which the family is cut.
    timeout_s: float | None = None
    #: Seconds a child may live from its spawn.
    child_timeout_s: float | None = None

    @property
    def descendant_budget(self) -> int:
        return max(0, self.token_budget - self.root_max_tokens)


def family_limits(
    *,
    max_tokens: int,
    max_children_per_request: int,
    token_factor: int | None,
    max_descendants: int,
    max_live_children: int,
    per_request: dict,
    timeout_s: float | None = None,
    child_timeout_s: float | None = None,
) -> FamilyLimits:
    """A request's limits: the server's, lowered by its per-request settings
    (``per_request``: keys without the ``seqhooks_`` prefix)."""
    factor = token_factor if token_factor is not None else 1 + max_children_per_request
    budget = factor * max_tokens
    if "max_family_tokens" in per_request:
        budget = min(budget, per_request["max_family_tokens"])
    return FamilyLimits(
        token_budget=budget,
        root_max_tokens=min(max_tokens, budget),
        max_descendants=min(max_descendants,
                            per_request.get("max_descendants", max_descendants)),
        max_live_children=max_live_children,
        timeout_s=_lowest(timeout_s, per_request.get("family_timeout_s")),
        child_timeout_s=_lowest(child_timeout_s, per_request.get("child_timeout_s")),
    )


def _lowest(*values: float | None) -> float | None:
    given = [v for v in values if v is not None]
    return min(given) if given else None


@dataclass(eq=False)
class FamilyLedger:
    """What one family has used, against its :class:`FamilyLimits`."""

    root_id: str
    limits: FamilyLimits
    #: Clock reading at the request's arrival (the family deadline's origin).
    started: float
    #: Tokens the descendants sampled (the request's own are not charged).
    descendant_tokens: int = 0
    descendants: int = 0
    live_children: int = 0
    #: Why the family stopped (TOKEN_BUDGET or DEADLINE), None while it runs.
    exhausted_by: str | None = None
    #: Descendants cut because the family stopped, and children timed out.
    cut_children: int = 0
    timed_out_children: int = 0
    #: Promises left as plain text, by reason.
    ignored: dict[str, int] = field(default_factory=dict)
    #: Live descendants whose tokens are charged when they end or when the
    #: family's usage is read, not as they sample: their budgets fit in
    #: what the family has left, so none of them can be trimmed or spend it.
    deferred: set[str] = field(default_factory=set)
    #: A descendant's budget did not fit with the others' once: from then
    #: on every descendant is charged as it samples.
    pressured: bool = False
    #: How many requests (not children) the engine had been given when
    #: the family spawned its first child (None: it has not spawned).
    forked_after: int | None = None

    @property
    def deadline(self) -> float | None:
        t = self.limits.timeout_s
        return None if t is None else self.started + t

    def tokens_left(self) -> int:
        return max(0, self.limits.descendant_budget - self.descendant_tokens)

    def spawn_refusal(self, engine_live_children: int, engine_max_live: int) -> str | None:
        """Why the next promise may not spawn a child (None: it may).
        Changes nothing (the speculative look-ahead asks too)."""
        reason = None
        if self.exhausted_by is not None:
            reason = self.exhausted_by
        elif self.tokens_left() <= 0:
            reason = TOKEN_BUDGET
        elif self.descendants >= self.limits.max_descendants:
            reason = DESCENDANTS
        elif self.live_children >= self.limits.max_live_children:
            reason = FAMILY_LIVE
        elif engine_live_children >= engine_max_live:
            reason = ENGINE_LIVE
        return reason

    def promise_ignored(self, reason: str) -> None:
        self.ignored[reason] = self.ignored.get(reason, 0) + 1

    def child_budget(self, wanted: int) -> int:
        """A new child's ``max_tokens``: what it would get, within what the
        family has left."""
        return max(1, min(wanted, self.tokens_left()))

    def fits(self, remaining: int) -> bool:
        """Whether descendants that may still sample ``remaining`` tokens in
        all fit in what the family has left (call with its usage settled)."""
        return not self.pressured and self.tokens_left() >= remaining

    def spawned(self) -> None:
        self.descendants += 1
        self.live_children += 1

    def child_ended(self) -> None:
        self.live_children = max(0, self.live_children - 1)

    def allowed(self, offered: int) -> int:
        """How many of ``offered`` tokens a descendant just sampled it may keep."""
        return min(offered, self.tokens_left())

    def charge(self, kept: int) -> bool:
        """Charge a descendant's kept tokens; True when that spent the budget
        (the family must be cut)."""
        self.descendant_tokens += kept
        if self.exhausted_by is None and self.tokens_left() <= 0:
            self.exhausted_by = TOKEN_BUDGET
            return True
        return False

    def expire(self, now: float) -> bool:
        """True when the family's deadline passed just now (cut it)."""
        deadline = self.deadline
        if deadline is None or now < deadline or self.exhausted_by == DEADLINE:
            return False
        self.exhausted_by = DEADLINE
        return True

    def child_deadline(self, spawned_at: float) -> float | None:
        t = self.limits.child_timeout_s
        return None if t is None else spawned_at + t

    def summary(self) -> dict:
        """The ``limits`` part of the request's trace."""
        return {
            "token_budget": self.limits.token_budget,
            "descendant_token_budget": self.limits.descendant_budget,
            "descendant_tokens": self.descendant_tokens,
            "max_descendants": self.limits.max_descendants,
            "max_live_children": self.limits.max_live_children,
            "timeout_s": self.limits.timeout_s,
            "child_timeout_s": self.limits.child_timeout_s,
            "exhausted_by": self.exhausted_by,
            "cut_children": self.cut_children,
            "timed_out_children": self.timed_out_children,
            "ignored_promises": dict(self.ignored),
        }
