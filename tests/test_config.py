"""SpecialKwargs: validation, token-string resolution, JSON round trip."""

from __future__ import annotations

import json

import pytest

from vllm_seqhooks.config.presets import coerce_special_kwargs
from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.config.request_keys import parse_request_overrides


class FakeTokenizer:
    """Whitespace-free toy tokenizer: specials are atomic, other chars map to
    ord(c)+100."""

    specials = {"<sync>": 6, "<promise>": 4, "</promise>": 5}

    def encode(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            for s, tid in self.specials.items():
                if text.startswith(s, i):
                    ids.append(tid)
                    i += len(s)
                    break
            else:
                ids.append(ord(text[i]) + 100)
                i += 1
        return ids

    def __len__(self):
        return 300


def test_defaults_match_design():
    k = SpecialKwargs(sync_token_id=6, promise_token_id=4)
    assert k.promise_end_token_id is None
    assert k.child_context == "fork"
    assert k.merge_strategy == "concatenate"
    assert k.merge_separator == "\n"
    assert k.max_child_depth == 1
    assert k.max_children_per_request == 16
    assert k.child_max_tokens is None


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(promise_token_id=4), "sync_token_id"),
        (dict(sync_token_id=6), "promise_token_id"),
        (dict(sync_token_id=6, promise_token_id=6), "must differ"),
        (dict(sync_token_id=6, promise_token_id=4, promise_end_token_id=4), "must differ"),
        (dict(sync_token_id=-1, promise_token_id=4), "sync_token_id"),
        (dict(sync_token_id=6, promise_token_id=-2), "promise_token_id"),
        (dict(sync_token_id="6", promise_token_id=4), "sync_token_id"),
        (dict(sync_token_id=True, promise_token_id=4), "sync_token_id"),
        (dict(sync_token_id=6, promise_token_id=4, merge_strategy="zip"), "merge_strategy"),
        (dict(sync_token_id=6, promise_token_id=4, child_context="clone"), "child_context"),
        (dict(sync_token_id=6, promise_token_id=4, max_child_depth=-1), "max_child_depth"),
        (dict(sync_token_id=6, promise_token_id=4, max_children_per_request=-1),
         "max_children_per_request"),
        (dict(sync_token_id=6, promise_token_id=4, child_max_tokens=0), "child_max_tokens"),
        (dict(sync_token_id=6, promise_token_id=4, merge_separator=3), "merge_separator"),
        (dict(sync_token_id=6, promise_token_id=4, child_prompt_template="x {payload}"),
         "child_prompt_template"),
        (dict(sync_token_id=6, promise_token_id=4, child_context="payload",
              child_prompt_template="no placeholder"), "child_prompt_template"),
        (dict(sync_token_id=6, promise_token_id=4, sync_token=""), "sync_token"),
        (dict(sync_token_id=6, promise_token_id=4, failed_child_marker=1), "failed_child_marker"),
    ],
)
def test_validation_errors_name_the_field(kwargs, field):
    with pytest.raises(SpecialKwargsError, match=field):
        SpecialKwargs(**kwargs)


def test_bad_value_is_in_message():
    with pytest.raises(SpecialKwargsError, match="'zip'"):
        SpecialKwargs(sync_token_id=6, promise_token_id=4, merge_strategy="zip")
    with pytest.raises(SpecialKwargsError, match="-3"):
        SpecialKwargs(sync_token_id=6, promise_token_id=4, max_child_depth=-3)


def test_unknown_dict_field_is_rejected():
    with pytest.raises(SpecialKwargsError, match="sync_tokn_id"):
        SpecialKwargs.from_dict({"sync_tokn_id": 1, "promise_token_id": 4})
    with pytest.raises(SpecialKwargsError, match="dict"):
        coerce_special_kwargs([1, 2])


@pytest.mark.parametrize("build", [
    lambda kw: SpecialKwargs(sync_token_id=1, promise_token_id=4, **kw),
    lambda kw: SpecialKwargs.from_dict({"sync_token_id": 1, "promise_token_id": 4, **kw})],
    ids=["keywords", "dict"])
def test_unknown_field_names_the_nearest_and_the_known_ones(build):
    """A misspelt field, as keyword or dict key, names the field meant and
    lists the known ones (a TypeError as well, like any unknown keyword)."""
    with pytest.raises(TypeError) as err:
        build({"max_child_dept": 2})
    assert isinstance(err.value, SpecialKwargsError)
    message = str(err.value)
    assert "'max_child_dept' (did you mean 'max_child_depth'?)" in message
    assert "known fields: batch_order," in message and "sync_token_id" in message
    with pytest.raises(SpecialKwargsError) as err:
        build({"zzz": 1})
    assert "'zzz';" in str(err.value)  # nothing close: no guess


def test_token_strings_resolve_through_tokenizer():
    k = SpecialKwargs(sync_token="<sync>", promise_token="<promise>",
                      promise_end_token="</promise>", merge_separator=" | ")
    assert not k.is_resolved
    r = k.resolve(FakeTokenizer())
    assert (r.sync_token_id, r.promise_token_id, r.promise_end_token_id) == (6, 4, 5)
    assert r.merge_separator_token_ids == (132, 224, 132)
    assert r.is_resolved
    assert k.sync_token_id is None  # resolve() returns a copy


def test_token_string_that_is_not_one_token():
    with pytest.raises(SpecialKwargsError, match=r"sync_token '<synk>' is not a single token"):
        SpecialKwargs(sync_token="<synk>", promise_token="<promise>").resolve(FakeTokenizer())


def test_token_string_and_id_must_agree():
    k = SpecialKwargs(sync_token="<sync>", sync_token_id=7, promise_token_id=4)
    with pytest.raises(SpecialKwargsError, match="sync_token '<sync>' is token id 6"):
        k.resolve(FakeTokenizer())


def test_vocab_check():
    k = SpecialKwargs(sync_token_id=6, promise_token_id=4000)
    with pytest.raises(SpecialKwargsError, match="promise_token_id 4000 is outside"):
        k.resolve(FakeTokenizer())
    with pytest.raises(SpecialKwargsError, match="sync_token_id 6 is outside"):
        SpecialKwargs(sync_token_id=6, promise_token_id=4).check_vocab(5)


def test_template_is_tokenized_around_payload():
    k = SpecialKwargs(sync_token_id=6, promise_token_id=4, child_context="payload",
                      child_prompt_template="Q:{payload}A:").resolve(FakeTokenizer())
    assert k.child_prompt_prefix_token_ids == (181, 158)
    assert k.child_prompt_suffix_token_ids == (165, 158)


def test_json_round_trip_and_additional_config():
    k = SpecialKwargs(sync_token="<sync>", promise_token="<promise>", child_max_tokens=9,
                      failed_child_marker="[failed]").resolve(FakeTokenizer())
    assert SpecialKwargs.from_json(k.to_json()) == k
    ac = k.to_additional_config({"other": 1})
    assert ac["other"] == 1
    json.dumps(ac)  # JSON-able, as vLLM's additional_config must be
    assert SpecialKwargs.from_additional_config(ac) == k
    assert SpecialKwargs.from_additional_config({"other": 1}) is None


def test_request_overrides():
    assert parse_request_overrides(None) == {}
    assert parse_request_overrides({"seqhooks_enabled": "false"}) == {"enabled": False}
    assert parse_request_overrides(
        {"seqhooks_child_max_tokens": 5, "seqhooks_max_child_depth": 0, "other": 1}
    ) == {"child_max_tokens": 5, "max_child_depth": 0}
    with pytest.raises(SpecialKwargsError, match="seqhooks_child_max_tokens"):
        parse_request_overrides({"seqhooks_child_max_tokens": 0})
    with pytest.raises(SpecialKwargsError, match="seqhooks_enabled"):
        parse_request_overrides({"seqhooks_enabled": "maybe"})


@pytest.mark.parametrize("fields, mistake, fix", [
    # child_header's one placeholder is {n}: a typo would be written literally
    (dict(child_header="<Thread>\n{m}:"), "holds '{m}', which is not a placeholder",
     "did you mean '<Thread>\\n{n}:'?"),
    (dict(child_header="<Thread>\n{ n }:"), "holds '{ n }'", "did you mean '<Thread>\\n{n}:'?"),
    (dict(child_header="<Thread>\n{n:"), "holds '{n', a placeholder with one brace",
     "did you mean '<Thread>\\n{n}:'?"),
    (dict(child_header="<Path>n}"), "holds 'n}'", "did you mean '<Path>{n}'?"),
    (dict(header_lead="\n{n}"), "header_lead '\\n{n}' holds {n}", "only child_header fills in"),
    # a tag's angle brackets go in pairs
    (dict(fork_tag="</Outlines"), "fork_tag '</Outlines' opens '<' without closing it",
     "did you mean '</Outlines>'?"),
    (dict(outline_tag="Outline>"), "outline_tag 'Outline>' closes a '>'", "did you mean '<Outline>'?"),
    (dict(child_end_tag="</Pa<th>"), "opens a second '<'", "go in pairs"),
    # one tag, two roles
    (dict(child_end_tag="</Outlines>"), "fork_tag and child_end_tag are both '</Outlines>'",
     "they must differ"),
    (dict(outline_tag="</Outlines>"), "fork_tag and outline_tag are both", "they must differ"),
])
def test_tag_format_mistakes_name_the_mistake_and_the_fix(fields, mistake, fix):
    """Mistakes in a tag format's texts are refused before any engine starts
    (they would otherwise be written, or waited for, literally)."""
    base = dict(fork_tag="</Outlines>", outline_tag="<Outline>", child_header="<Thread>\n{n}:",
                child_end_tag="</Thread>")
    with pytest.raises(SpecialKwargsError) as err:
        SpecialKwargs(**{**base, **fields})
    assert mistake in str(err.value) and fix in str(err.value)


@pytest.mark.parametrize("fields", [
    dict(fork_tag="<<FORK>>", fork_count=2, child_end_tag="<</FORK>>"),
    dict(fork_tag="<|fork|>", fork_count=2, child_end_tag="<|end|>"),
    dict(fork_tag="Plan ->", fork_count=2, child_end_tag="=> done"),
    dict(fork_tag="<!--fork-->", fork_count=2, child_header='{"step": {n}, "text": "'),
    dict(fork_tag="[FORK]", outline_tag="- item", child_header="{n}. ", child_end_tag="[END]"),
])
def test_custom_tag_formats_are_not_refused(fields):
    """The rules above leave custom formats alone: nested or piped brackets,
    arrows, braces that are text, tags without brackets."""
    assert SpecialKwargs(**fields).tag_format is not None


def test_child_prompt_template_placeholder_typo_names_the_fix():
    with pytest.raises(SpecialKwargsError) as err:
        SpecialKwargs(sync_token_id=6, promise_token_id=4, child_context="payload",
                      child_prompt_template="sort {Payload}=")
    assert ("child_prompt_template 'sort {Payload}=' holds '{Payload}', which is not a "
            "placeholder: the only one is {payload}") in str(err.value)
    assert "did you mean 'sort {payload}='?" in str(err.value)
    with pytest.raises(SpecialKwargsError, match=r"did you mean 'sort \{payload\}='"):
        SpecialKwargs(sync_token_id=6, promise_token_id=4, child_context="payload",
                      child_prompt_template="sort {payload=")
