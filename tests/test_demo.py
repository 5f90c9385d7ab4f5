"""``python -m vllm_seqhooks`` grades a trained model by the format its
``seqhooks.json`` names (issue 49): the promise model with
``vllm_seqhooks.tasks.forkjoin``, the ThreadWeaver model with
``vllm_seqhooks.tasks.threadweaver``; its summary line names the tags of that
format; a directory it cannot grade is refused, saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_seqhooks.__main__ import summary_line, trained_model
from vllm_seqhooks.tasks import forkjoin, threadweaver

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.delenv("SEQHOOKS_FORKJOIN_MODEL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def test_the_default_is_the_promise_model():
    model, fmt = trained_model(None)
    assert model == forkjoin.MODEL_DIR
    assert (fmt.name, fmt.task) == ("promise", forkjoin)


def test_the_threadweaver_model_is_graded_as_threadweaver():
    model, fmt = trained_model(threadweaver.MODEL_DIR)
    assert (fmt.name, fmt.task) == ("threadweaver", threadweaver)
    assert fmt.task.PARENT_MAX_TOKENS == threadweaver.PARENT_MAX_TOKENS == 96
    # The model's right answer: graded right by its format's task, wrong by
    # the promise task (what the demo did before).
    problem = threadweaver.Problem("12345678")
    text = threadweaver.expected_text(problem.digits)
    assert fmt.task.check(problem, text)
    assert fmt.task.extract_answer(text) == "12345678"
    assert not forkjoin.check(problem, text)


def test_the_summary_names_the_format_s_tags():
    _, promise = trained_model(forkjoin.MODEL_DIR)
    _, tw = trained_model(threadweaver.MODEL_DIR)
    line = summary_line(promise, 5, 5, 1.0)
    assert line.startswith("5/5 correct in 1.00s; ")
    assert "<promise>" in line and "<sync>" in line
    line = summary_line(tw, 1, 1, 0.25)
    assert line.startswith("1/1 correct in 0.25s; ")
    for tag in ("<Outlines>", "</Outlines>", "<Outline>", "<Thread>", "</Thread>",
                "<Conclusion>", "</Conclusion>"):
        assert tag in line, tag
    assert "promise" not in line and "<sync>" not in line


def _model_dir(tmp_path: Path, settings=None, raw: str | None = None) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"")
    if raw is not None:
        (model / "seqhooks.json").write_text(raw)
    elif settings is not None:
        (model / "seqhooks.json").write_text(json.dumps(settings))
    return model


def test_a_model_without_seqhooks_json_is_refused(tmp_path):
    model = _model_dir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        trained_model(model)
    msg = str(exc.value)
    assert str(model / "seqhooks.json") in msg
    assert '"promise"' in msg and '"threadweaver"' in msg


@pytest.mark.parametrize("settings", [{"format": "apr"}, {"child_max_tokens": 8}, ["x"]])
def test_an_unknown_format_is_refused(tmp_path, settings):
    model = _model_dir(tmp_path, settings)
    with pytest.raises(SystemExit) as exc:
        trained_model(model)
    msg = str(exc.value)
    assert str(model / "seqhooks.json") in msg
    assert "vllm_seqhooks.tasks.forkjoin" in msg and "vllm_seqhooks.tasks.threadweaver" in msg


def test_unreadable_seqhooks_json_is_refused(tmp_path):
    model = _model_dir(tmp_path, raw="{not json")
    with pytest.raises(SystemExit) as exc:
        trained_model(model)
    assert str(model / "seqhooks.json") in str(exc.value)


def test_a_directory_without_weights_points_to_training_outside_the_package(tmp_path):
    with pytest.raises(SystemExit) as exc:
        trained_model(tmp_path / "nowhere")
    msg = str(exc.value)
    trained = tmp_path / "xdg" / "vllm-seqhooks" / "models" / "forkjoin_model"
    assert str(tmp_path / "nowhere") in msg
    assert "scripts/train_tiny_forkjoin.py" in msg
    assert f"writes {trained}" in msg
    assert f"--model {trained}" in msg
    # The embedded models are offered to run, not as a place to train into.
    assert f"--model {forkjoin.MODEL_DIR}" in msg
    assert f"--model {threadweaver.MODEL_DIR}" in msg


@pytest.mark.slow
def test_the_threadweaver_model_demo_answers_right(monkeypatch, capsys):
    """The demo's ``main`` with the command line's arguments, in this process
    with an in-process engine: what is checked is how the demo grades the
    ThreadWeaver model's answer, not the process it runs in (the command
    itself, ``python -m vllm_seqhooks --model
    vllm_seqhooks/data/threadweaver_model`` in its own process with vLLM's
    default multiprocess engine, is run by tests/test_docs_commands.py and
    the installed wheel's demo by tests/test_wheel.py)."""
    from tests.support.torch_threads import one_torch_thread
    from vllm_seqhooks.__main__ import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")  # (main() sets it by default)
    with one_torch_thread():
        code = main(["--model", "vllm_seqhooks/data/threadweaver_model", "12345678"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "answer   : 12345678   (correct)" in out, out[-3000:]
    assert "1/1 correct" in out and "</Outlines>" in out
    assert "WRONG" not in out


@pytest.mark.slow
def test_the_scripted_demo_forks_and_joins(monkeypatch, capsys):
    """``python -m vllm_seqhooks --scripted``'s ``main``, in this process
    with an in-process engine: the random-weight model is built (into the
    test's cache directory), the script forces the hook tokens, and every
    demo request forks and joins. (The scripted model from the installed
    wheel runs in the wheel's install check, tests/test_wheel.py.)"""
    from tests.support.torch_threads import one_torch_thread
    from vllm_seqhooks.__main__ import DEMOS, main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    with one_torch_thread():
        code = main(["--scripted"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert out.count("prompt : ") == len(DEMOS), out[-3000:]
    assert f"{len(DEMOS)} requests with fork/join" in out
    assert "<sync>" in out and "join of" in out, out[-3000:]
