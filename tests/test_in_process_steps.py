"""Two in-process hook engines stepping in two threads of one process
compute their own batches (vllm_seqhooks/engine/in_process_steps.py):
vLLM's forward context is one per process, and without the step lock the
scores of one engine came out up to 19.4 off while the other stepped."""

from __future__ import annotations

import pytest

from tests.support.engine_modes import IN_PROCESS, MODES, run_in_mode

pytestmark = pytest.mark.slow


def test_an_engine_scores_the_same_while_another_steps_beside_it(tiny_model_dir):
    got = run_in_mode(MODES[0], "tests.support.engines_in_threads:score_beside_another_engine",
                      kwargs=dict(model=tiny_model_dir, seconds=12.0), env=IN_PROCESS)
    assert got["errors"] == []
    assert got["runs"] >= 3 and got["batches"] >= 3  # (both engines stepped, in turns)
    assert got["worst"] == 0.0
    assert got["freed_without_the_collector"] == [True, True]
