"""Hook settings by format name and carried by the model (``"auto"``)."""

from __future__ import annotations

import json

import pytest

from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.config.presets import MODEL_FILE, expand


def test_promise_preset_is_the_promise_protocol():
    assert expand("promise") == {"sync_token": "<sync>", "promise_token": "<promise>",
                                 "promise_end_token": "</promise>"}


def test_dict_names_a_format_and_overrides_it():
    got = expand({"format": "promise", "child_max_tokens": 5, "promise_end_token": "</p>"})
    assert got["child_max_tokens"] == 5 and got["promise_end_token"] == "</p>"
    assert got["sync_token"] == "<sync>"
    # an id replaces the preset's token string for that hook
    got = expand({"format": "promise", "sync_token_id": 6})
    assert "sync_token" not in got and got["sync_token_id"] == 6
    # a dict without a format is plain fields
    assert expand({"sync_token_id": 1, "promise_token_id": 2}) == {
        "sync_token_id": 1, "promise_token_id": 2}


def test_auto_reads_the_model_directory(tmp_path):
    (tmp_path / MODEL_FILE).write_text(json.dumps(
        {"format": "promise", "merge_separator": ","}))
    got = coerce_special_kwargs("auto", tmp_path)
    assert isinstance(got, SpecialKwargs)
    assert (got.sync_token, got.merge_separator) == ("<sync>", ",")
    # overrides on top of what the model carries
    got = coerce_special_kwargs({"format": "auto", "merge_separator": ";"}, tmp_path)
    assert got.merge_separator == ";" and got.promise_token == "<promise>"


@pytest.mark.parametrize("spec,content,match", [
    ("quokka", None, "unknown hook format 'quokka'; known: promise, threadweaver, multiverse, npr, parallel-r1, auto"),
    ("auto", None, "seqhooks.json"),
    ("auto", "[1, 2]", "must hold a JSON object"),
    ("auto", "{not json", "not valid JSON"),
    ("auto", '{"format": "auto"}', "cannot be 'auto'"),
    ({"format": 3}, None, "must be a format name"),
    ("auto", '{"format": "promise", "sync_tokn": "x"}', "unknown special_kwargs field"),
])
def test_bad_specs_say_what_is_wrong(tmp_path, spec, content, match):
    if content is not None:
        (tmp_path / MODEL_FILE).write_text(content)
    with pytest.raises(SpecialKwargsError, match=match):
        coerce_special_kwargs(spec, tmp_path)


def test_embedded_model_carries_the_settings_it_was_trained_with():
    """``"auto"`` on the embedded model resolves to the ids and texts of
    ``tasks.forkjoin.hook_settings()``."""
    from transformers import AutoTokenizer

    from vllm_seqhooks.tasks import forkjoin as task

    shipped = json.loads((task.model_dir() / MODEL_FILE).read_text())
    assert shipped == task.SEQHOOKS_JSON
    tok = AutoTokenizer.from_pretrained(str(task.model_dir()))
    auto = coerce_special_kwargs("auto", task.model_dir()).resolve(tok)
    explicit = SpecialKwargs(**task.hook_settings()).resolve(tok)
    fields = ("sync_token_id", "promise_token_id", "promise_end_token_id", "child_context",
              "merge_separator_token_ids", "child_prompt_prefix_token_ids",
              "child_prompt_suffix_token_ids", "child_max_tokens")
    assert {f: getattr(auto, f) for f in fields} == {f: getattr(explicit, f) for f in fields}
