"""The vLLM releases this package supports, and where they differ.

Each supported release is a :class:`Release`: its version and, for every
difference between releases that the engine meets, which way this release
goes. The release installed is read once (:func:`installed`), at start-up;
the port's adapters (:mod:`.sessions`, :mod:`.scheduler_calls`,
:mod:`.scheduler`) ask it, the engine's parts never do. A vLLM that is not
listed here is refused at start-up, naming the releases that are.

Adding a release: read its scheduler, KV-cache manager, request and
model-runner sources against the previous one (the private names
:mod:`.scheduler` lists, the assumptions of :mod:`.sessions`, the source
digests of :mod:`.runner` and :mod:`.input_batch`), add a :class:`Release`
whose fields say how it differs, run the whole suite and vLLM's own scheduler
tests (``tests/upstream/run_conformance.py --vllm-version``) on it, and say
in docs/install.md what was tested (checklist: docs/install.md, "Adding a
vLLM release").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Release:
    """One supported vLLM release, by how it differs from the others."""

    version: str
    #: ``Scheduler._get_local_prefix_cache_hit`` and
    #: ``KVCacheManager.get_computed_blocks`` take ``max_cache_hit_length``
    #: (0.33: a KV connector's aux output may cap a hit).
    hit_takes_max_length: bool
    #: ``Scheduler._handle_stopped_request`` keeps a resumable request but
    #: no longer queues it; ``update_from_output`` queues the kept requests
    #: after its loop (0.33).
    kept_requests_queued_after_loop: bool
    #: ``Scheduler._update_request_with_output`` takes back the computed
    #: tokens of what it cut after a stop (0.33; 0.32 leaves them counted).
    rolls_back_cut_at_stop: bool
    #: ``Scheduler._update_request_as_session`` keeps a session's tokens up
    #: to its last one (0.33: ``num_tokens - 1``, which must not be below
    #: ``num_computed_tokens``); 0.32 cuts at ``num_computed_tokens``.
    session_keeps_up_to_last_token: bool
    #: The block hasher may hash a block with look-ahead tokens past it
    #: (0.33: EAGLE with prefix caching, ``num_hash_lookahead_tokens``).
    hashes_with_lookahead: bool
    #: A worker extension's ``init_worker_extension(worker)`` is called in
    #: each worker before the model is loaded (0.33); before, importing the
    #: extension class is the only hook.
    calls_worker_extension_init: bool
    #: A streamed completion's final chunk carries the output's
    #: ``kv_transfer_params`` (where the hook trace is) (0.33).
    streams_kv_transfer_params: bool


RELEASES: dict[str, Release] = {
    "0.32.0": Release("0.32.0", hit_takes_max_length=False,
                      kept_requests_queued_after_loop=False, rolls_back_cut_at_stop=False,
                      session_keeps_up_to_last_token=False, hashes_with_lookahead=False,
                      calls_worker_extension_init=False, streams_kv_transfer_params=False),
    "0.33.0": Release("0.33.0", hit_takes_max_length=True,
                      kept_requests_queued_after_loop=True, rolls_back_cut_at_stop=True,
                      session_keeps_up_to_last_token=True, hashes_with_lookahead=True,
                      calls_worker_extension_init=True, streams_kv_transfer_params=True),
}
SUPPORTED_VERSIONS = tuple(RELEASES)


def installed_version() -> str:
    """The installed vLLM's version, without a local label (``+cpu``)."""
    import vllm

    return str(getattr(vllm, "__version__", "?")).split("+")[0]


@lru_cache(maxsize=1)
def installed() -> Release:
    """The installed vLLM's :class:`Release` (read once). An unsupported
    version raises :class:`ValueError` naming the supported ones (the
    start-up check reports it first, with the rest)."""
    version = installed_version()
    if version not in RELEASES:
        raise ValueError(version_problem(version))
    return RELEASES[version]


def version_problem(version: str) -> str:
    return (f"vLLM {version} is installed; vllm-seqhooks supports vLLM "
            f"{' and '.join(SUPPORTED_VERSIONS)} (the releases it was tested on)")
