"""engine/worker_exit.py: an engine started inside ``worker_exit_grace``
gives its worker 30 s to exit; a user's own value wins; the caller's
environment is as before afterwards (the multiprocess engine's processes
are checked in test_llm_entrypoint.py)."""

from __future__ import annotations

import os

from vllm_seqhooks.engine.worker_exit import ENV_VAR, WORKER_EXIT_S, worker_exit_grace


def test_the_grace_is_set_only_while_the_engine_starts(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    with worker_exit_grace():
        assert os.environ[ENV_VAR] == str(WORKER_EXIT_S)
    assert ENV_VAR not in os.environ


def test_a_users_value_wins_and_stays(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "7")
    with worker_exit_grace():
        assert os.environ[ENV_VAR] == "7"
    assert os.environ[ENV_VAR] == "7"
