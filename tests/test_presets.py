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
    ("auto", '{"format": "promise", "sync_tokn": "x"}',
     r"unknown field\(s\) in .*seqhooks.json: 'sync_tokn' \(did you mean 'sync_token'\?\)"),
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


@pytest.mark.parametrize("field, typo, meant", [
    ("outline_tag", "<Outlne>", "<Outline>"),
    ("child_end_tag", "</thread>", "</Thread>"),
    ("child_end_tag", "</Thraed>", "</Thread>"),
])
def test_a_near_miss_of_a_named_formats_tag_says_did_you_mean(field, typo, meant):
    """Overriding a named format's tag with a near miss of it (one or two
    edits) is refused, naming the tag meant and the way to keep the value:
    the same settings without naming the format, which then give exactly
    the configuration asked for."""
    from vllm_seqhooks.config.presets import NearPresetTagError

    with pytest.raises(NearPresetTagError) as err:
        coerce_special_kwargs({"format": "threadweaver", field: typo, "child_max_tokens": 8})
    message = str(err.value)
    assert f"{field} {typo!r} is " in message and f"did you mean {meant!r}?" in message
    assert "give the settings without naming a format" in message
    as_given = json.loads(message.split("(then no tag is compared): ", 1)[1])
    assert as_given == err.value.settings and "format" not in as_given
    got = coerce_special_kwargs(as_given)
    assert getattr(got, field) == typo and got.child_max_tokens == 8
    assert got.child_header == expand("threadweaver")["child_header"]


def test_an_unclosed_tag_is_refused_without_a_way_out():
    """A near miss whose brackets do not pair is not offered as settings to
    give: the tag format refuses it whatever names it."""
    for spec in ({"format": "threadweaver", "fork_tag": "</Outlines"},
                 {**expand("threadweaver"), "fork_tag": "</Outlines"}):
        with pytest.raises(SpecialKwargsError) as err:
            coerce_special_kwargs(spec)
        assert str(err.value) == ("fork_tag '</Outlines' opens '<' without closing it with '>'; "
                                  "did you mean '</Outlines>'?")


@pytest.mark.parametrize("overrides", [
    {"child_end_tag": "</Path>"},                # another format's tag: far from '</Thread>'
    {"fork_tag": "</Outlines>\n"},               # whitespace around the tag: on purpose
    {"outline_tag": "<Outline>"},                # the format's own value
    {"child_end_tag": "</Thread>", "merge_suffix": "\n"},
])
def test_real_overrides_of_a_named_format_are_taken(overrides):
    got = coerce_special_kwargs({"format": "threadweaver", **overrides})
    assert all(getattr(got, k) == v for k, v in overrides.items())


def test_a_near_miss_in_seqhooks_json_names_the_file(tmp_path):
    from vllm_seqhooks.config.presets import ModelFileError

    (tmp_path / MODEL_FILE).write_text(json.dumps({"format": "multiverse", "fork_tag": "</Gaol>"}))
    with pytest.raises(ModelFileError) as err:
        coerce_special_kwargs("auto", tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / MODEL_FILE}: fork_tag '</Gaol>' is one edit")
    assert "did you mean '</Goal>'?" in message
    assert f"write the settings in {tmp_path / MODEL_FILE} without naming a format" in message
    # a flag-level override of what the file names is compared with the file's value
    (tmp_path / MODEL_FILE).write_text(json.dumps({"format": "multiverse"}))
    with pytest.raises(SpecialKwargsError, match="the model's settings's '<Outline>'"):
        coerce_special_kwargs({"format": "auto", "outline_tag": "<Outlin>"}, tmp_path)


def test_a_typo_in_seqhooks_json_names_the_file_the_field_and_the_fields(tmp_path):
    from vllm_seqhooks.config.presets import ModelFileError

    path = tmp_path / MODEL_FILE
    path.write_text(json.dumps({"format": "threadweaver", "child_max_tokns": 8, "fromat": 1}))
    with pytest.raises(ModelFileError) as err:
        coerce_special_kwargs("auto", tmp_path)
    message = str(err.value)
    assert message.startswith(f"unknown field(s) in {path}: ")
    assert "'child_max_tokns' (did you mean 'child_max_tokens'?)" in message
    assert "'fromat' (did you mean 'format'?)" in message
    known = message.split(f"the fields of {MODEL_FILE}: ")[1].split(", ")
    assert {"format", "child_max_tokens", "fork_tag", "max_child_depth"} <= set(known)
    assert not any(k.startswith("--") for k in known)


@pytest.mark.parametrize("where, says", [
    ("missing", "but the model path {model!r} does not exist: name a format instead "
                "(promise, threadweaver, multiverse, npr, parallel-r1) or give the settings"),
    ("dir", "and the model directory {model!r} has none: write one there, or name a format"),
    ("file", "and {model!r} is a file, not a model directory: name a format"),
    ("hub", "'auto' reads seqhooks.json from a local model directory only, and {model!r} is "
            "none (it looks like a hub id): give the model's local directory, or name a format"),
])
def test_auto_says_why_it_found_no_settings(tmp_path, monkeypatch, where, says):
    monkeypatch.chdir(tmp_path)
    model = {"missing": str(tmp_path / "nonexistent"), "dir": str(tmp_path),
             "file": str(tmp_path / "weights.bin"), "hub": "Qwen/Qwen3-8B"}[where]
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(SpecialKwargsError) as err:
        coerce_special_kwargs("auto", model)
    assert says.format(model=model) in str(err.value)
