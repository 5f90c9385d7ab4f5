"""Tag formats, pure (no vLLM): tags found in the token stream whatever a
byte-level BPE tokenizer merged them with, outline items, headers that are
the tokens a fresh request would get, the merge layout, the presets."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import random

import pytest

from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.core.join_plan import merged_layout
from vllm_seqhooks.formats.events import EndTagReached, ForkReached
from vllm_seqhooks.formats.boundaries import child_prompt
from vllm_seqhooks.formats.tag_format import TagFormat, TagFormatError
from vllm_seqhooks.formats.tag_format_scanner import TagFormatScanner
from vllm_seqhooks.formats.text_codec import TextCodec
from vllm_seqhooks.config.presets import PRESETS, expand
from vllm_seqhooks.formats.tag_scan import TagScanner
from vllm_seqhooks.formats.token_bytes import token_bytes_table
from vllm_seqhooks.formats.events import PromiseIgnored

TAG_PRESETS = [name for name in PRESETS if "fork_tag" in PRESETS[name]]
ALL_TAGS = sorted({v for name in TAG_PRESETS for k, v in PRESETS[name].items()
                   if k in ("fork_tag", "outline_tag", "child_end_tag")})


@functools.lru_cache(maxsize=1)
def _corpus() -> str:
    """Text shipped with Python, with the formats' tags written in it the
    way the models write them."""
    import argparse
    import json as json_module
    import textwrap

    text = "".join(inspect.getsource(m) for m in (argparse, json_module, textwrap))
    rng = random.Random(0)
    words = text.split()
    samples = []
    for _ in range(400):
        a, b = (" ".join(rng.choices(words, k=rng.randint(1, 6))) for _ in range(2))
        samples.append(
            f"<Parallel>\n<Outlines>\n<Outline>1: {a}</Outline>\n<Outline>2: {b}</Outline>\n"
            f"</Outlines>\n<Thread>\n1: {b}</Thread>\n<Goal>\n<Outline>\n1: {a}\n</Outline>\n"
            f"</Goal>\n<Path>\n1: {a}\n</Path>\n<guideline>\n<plan>1: {b}</plan>\n</guideline>"
            f"<step>\n1:{a}</step>{b}<Parallel><Path>{a}</Path></Parallel>\n<Summary>")
    return text + "\n".join(samples)


def _bpe(use_regex: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    # Without a pre-tokenizer a "word" is a whole line: train on lines.
    tok.train_from_iterator(_corpus().splitlines(keepends=True), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module", params=["gpt2_regex", "no_pretokenizer", "tiny_chars"])
def tokenizer(request):
    if request.param == "tiny_chars":
        from transformers import PreTrainedTokenizerFast

        from vllm_seqhooks.scripted.tiny_model import build_tokenizer

        return PreTrainedTokenizerFast(tokenizer_object=build_tokenizer())
    return _bpe(use_regex=request.param == "gpt2_regex")


def _codec(tokenizer) -> TextCodec:
    return TextCodec(token_bytes_table(tokenizer),
                     lambda text: tokenizer.encode(text, add_special_tokens=False))


def _texts() -> list[str]:
    rng = random.Random(1)
    words = _corpus().split()
    out = ["x</Outlines>y", " </Outlines>\n", "</Outlines></Outlines>", "<</Outlines>>",
           "a</Thread>b</Thread>", "</Path>\n<Path>", "<Parallel><Path>z</Path></Parallel>"]
    for _ in range(150):
        parts = [" ".join(rng.choices(words, k=rng.randint(0, 4)))]
        for _ in range(rng.randint(1, 4)):
            parts.append(rng.choice(ALL_TAGS))
            parts.append(rng.choice(["", " ", "\n", ">", "x", "1:", " é"]) +
                         " ".join(rng.choices(words, k=rng.randint(0, 3))))
        out.append("".join(parts))
    return out


def _expected_hits(text: str, ids: list[int], table, tags: list[bytes]):
    data = text.encode()
    owner: list[int] = []
    for pos, t in enumerate(ids):
        owner.extend([pos] * len(table[t]))
    assert len(owner) == len(data)
    hits = []
    for index, tag in enumerate(tags):
        at = data.find(tag)
        while at != -1:
            hits.append((at + len(tag), index, owner[at], owner[at + len(tag) - 1]))
            at = data.find(tag, at + 1)
    hits.sort()
    return [(i, first, last) for _, i, first, last in hits]


def test_token_bytes_rebuild_the_text(tokenizer):
    table = token_bytes_table(tokenizer)
    for text in _texts() + ["naïve café — 漢字 ✓"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if "<unk>" in tokenizer.convert_ids_to_tokens(ids):
            continue  # the tiny model's characters are ASCII only
        assert b"".join(table[t] for t in ids) == text.encode()


def test_tags_are_found_whatever_the_merges(tokenizer):
    table = token_bytes_table(tokenizer)
    tags = [t.encode() for t in ALL_TAGS]
    rng = random.Random(2)
    merged_with_text = 0
    for text in _texts():
        ids = tokenizer.encode(text, add_special_tokens=False)
        if b"".join(table[t] for t in ids) != text.encode():
            continue
        expected = _expected_hits(text, ids, table, tags)
        one_by_one = TagScanner(table, tags)
        got = [h for pos, t in enumerate(ids) for h in one_by_one.feed([t], pos)]
        assert [(h.tag, h.first_pos, h.pos) for h in got] == expected, text
        chunked, pos, got = TagScanner(table, tags), 0, []
        while pos < len(ids):
            n = rng.randint(1, 5)
            got += chunked.feed(ids[pos:pos + n], pos)
            pos += n
        assert [(h.tag, h.first_pos, h.pos) for h in got] == expected, text
        for tag_index, first, last in expected:
            # Tokens holding the tag that also hold other text.
            span = b"".join(table[t] for t in ids[first:last + 1])
            merged_with_text += span != tags[tag_index]
    if tokenizer.__class__.__name__ and len(tokenizer) > 200:  # the BPE ones
        assert merged_with_text > 20, "the test should see tags merged with text"


def test_a_fork_reads_its_outline_items_in_order():
    fmt = TagFormat(**{k: v for k, v in expand("threadweaver").items()
                       if k in TagFormat.__dataclass_fields__})
    table = [bytes([i]) for i in range(256)]
    codec = TextCodec(table, lambda text: list(text.encode()))
    text = ("<Outline>9: old</Outline></Outlines>plain <Outlines>\n<Outline> 2 : b</Outline>"
            "<Outline>1: a</Outline><Outline>2: again</Outline>\n</Outlines>")
    scanner = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False, max_children=8)
    events = scanner.feed(list(text.encode()), 100)
    forks = [e for e in events if isinstance(e, ForkReached)]
    assert [f.labels for f in forks] == [("9",), ("2", "1")]
    assert forks[1].pos == 100 + len(text.encode()) - 1
    assert forks[1].tag_start == 100 + len(text.encode()) - len(b"</Outlines>")
    # No items since the last fork: the tag is plain text.
    assert scanner.feed(list(b"</Outlines>"), 500) == [PromiseIgnored(510, "no_outline_items")]
    # The request's children limit keeps the first items.
    few = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False, max_children=1)
    ignored, fork = few.feed(list(b"<Outline>1: a<Outline>2: b</Outlines>"), 0)
    assert fork.labels == ("1",)
    assert ignored == PromiseIgnored(fork.pos, "max_children_per_request")
    assert few.feed(list(b"<Outline>3: c</Outlines>"), 100)[0].reason == "max_children_per_request"


def test_fixed_count_and_end_tags():
    fmt = TagFormat(fork_tag="<Parallel>", fork_count=2, child_header="<Path>",
                    child_end_tag="</Path>")
    codec = TextCodec([bytes([i]) for i in range(256)], lambda text: list(text.encode()))
    parent = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False)
    (fork,) = parent.feed(list(b"think<Parallel>"), 0)
    assert fork.labels == ("1", "2") and fork.pos == 14
    assert parent.feed(list(b"</Path>"), 15) == []  # a parent does not end at it
    child = TagFormatScanner(fmt, codec, may_fork=False, ends_at_tag=True)
    assert child.feed(list(b"x<Parallel>y</Path>z"), 0) == [EndTagReached(18)]
    assert fmt.eos_text == "</Path>"
    with pytest.raises(ValueError):
        TagFormatScanner(fmt, codec, may_fork=False, ends_at_tag=False)


def test_child_prompt_is_what_a_fresh_request_gets(tokenizer):
    """"text": a child's prompt is the tokens of the parent's text cut at the
    fork tag's last byte plus the lead and header, as one string, whatever
    the token holding the tag's last byte carries past it; "ids": the
    parent's tokens as sampled through the tag, then the lead and header
    encoded alone."""
    codec = _codec(tokenizer)
    rng = random.Random(3)
    words = _corpus().split()
    for name in TAG_PRESETS:
        fmt = dataclasses.replace(SpecialKwargs(**expand(name)).tag_format,
                                  boundary_tokenization="text")
        ids_fmt = dataclasses.replace(fmt, boundary_tokenization="ids")
        compared = 0
        for _ in range(40):
            text = " ".join(rng.choices(words, k=5)) + rng.choice(["", " ", "\n", "x"]) + fmt.fork_tag
            after = rng.choice(["", "\n", "\n\n", " ", "x", "1", "<", "></x>"])
            sampled = list(tokenizer.encode(text + after, add_special_tokens=False))
            hit = TagScanner(codec.table, [fmt.fork_tag.encode()]).feed(sampled, 0)[-1]
            context = sampled[: hit.pos + 1]
            label = str(rng.randint(1, 12))
            prompt, kept = child_prompt(codec, fmt, context, hit.first_pos, label)
            fresh = tokenizer.encode(text + fmt.child_start(label), add_special_tokens=False)
            assert prompt[:kept] == context[:kept]
            if fresh[: hit.first_pos] == context[: hit.first_pos]:
                assert prompt == fresh, (name, text, after)
                compared += 1
            assert codec.text(prompt) == (text + fmt.child_start(label)).encode()
            ids_prompt, ids_kept = child_prompt(codec, ids_fmt, context, hit.first_pos, label)
            carried = len(codec.text(context)) - len(text.encode())
            through = list(context)
            if carried:  # the tag's last token, re-encoded through the tag
                last = codec.text(context[-1:])
                through = [*context[:-1], *codec.encode(last[:-carried].decode())]
            assert ids_kept == len(context) - (1 if carried else 0)
            assert ids_prompt == [*through, *codec.encode(fmt.child_start(label))]
        assert compared >= 20, name


def test_merge_layout():
    assert merged_layout([(1, 2), (1, 3)], [(2,), (3,)], [[10], [20, 21]], [9], [7, 7]) == [
        1, 2, 10, 9, 3, 20, 21, 7, 7]
    assert merged_layout([(), ()], [(), ()], [[10], [20]], [9]) == [10, 9, 20]


@pytest.mark.parametrize("name", TAG_PRESETS)
def test_presets_are_valid_and_expressible(name):
    from transformers import PreTrainedTokenizerFast

    from vllm_seqhooks.scripted.tiny_model import build_tokenizer

    hooks = SpecialKwargs(**expand(name))
    assert hooks.tag_format is not None
    resolved = hooks.resolve(PreTrainedTokenizerFast(tokenizer_object=build_tokenizer()))
    assert resolved.is_resolved
    assert SpecialKwargs.from_json(resolved.to_json()) == resolved
    # Overrides by name.
    assert SpecialKwargs(**expand({"format": name, "merge_suffix": "X"})).merge_suffix == "X"


def test_a_tag_the_tokenizer_cannot_write_fails_at_resolve():
    from transformers import PreTrainedTokenizerFast

    from vllm_seqhooks.scripted.tiny_model import build_tokenizer

    hooks = SpecialKwargs(**expand({"format": "threadweaver", "child_end_tag": "</Réponse>"}))
    with pytest.raises(SpecialKwargsError, match="child_end_tag '</Réponse>' cannot be written"):
        hooks.resolve(PreTrainedTokenizerFast(tokenizer_object=build_tokenizer()))


@pytest.mark.parametrize("fields, message", [
    (dict(fork_tag="</Outlines>"), "exactly one of outline_tag"),
    (dict(fork_tag="</Outlines>", outline_tag="<Outline>", fork_count=2), "exactly one of"),
    (dict(fork_tag="", fork_count=2), "fork_tag must be a non-empty string"),
    (dict(fork_tag="<P>", fork_count=0), "fork_count must be an integer >= 1"),
    (dict(fork_tag="<P>", fork_count=True), "fork_count must be an integer >= 1"),
    (dict(fork_tag="<P>", fork_count=2, child_header="{n}{n}"), "child_header may hold"),
    (dict(fork_tag="<P>", fork_count=2, fork_min_tokens=-1), "fork_min_tokens"),
    (dict(fork_tag="<P>", fork_count=2, merge_suffix=None), "merge_suffix must be a string"),
    (dict(fork_tag="<P>", fork_count=2, promise_token="<promise>"), "cannot be combined"),
    (dict(fork_tag="<P>", fork_count=2, sync_token_id=5), "cannot be combined"),
])
def test_bad_tag_formats_say_what_is_wrong(fields, message):
    with pytest.raises((SpecialKwargsError, TagFormatError), match=message):
        SpecialKwargs(**fields)


def test_tag_format_travels_as_json():
    hooks = SpecialKwargs(**expand("parallel-r1"))
    back = SpecialKwargs.from_dict(json.loads(hooks.to_json()))
    assert back.tag_format == hooks.tag_format
    assert back.tag_format.fork_count == 2


@pytest.mark.parametrize("name", TAG_PRESETS)
def test_quiet_steps_change_no_event(name):
    """The engine skips a step whose tokens are all outside the scanner's
    ``watched_ids`` (no tag under way and none can begin in them) and
    feeds them later when the scanner ``needs_history``: on random
    multi-token steps of text full of tags, split by a BPE-like table,
    the events are the same as feeding every step, at the same positions,
    and some steps are skipped."""
    fmt = TagFormat(**{k: v for k, v in expand(name).items()
                       if k in TagFormat.__dataclass_fields__})
    pieces = ["<", "</", ">", ">\n", "\n", " ", "1", "2", ": ", "a", "bc", "Out", "line",
              "lines", "Path", "Thread", "<Out", "<Path", "/", "x y", "guide", "Goal"]
    table = [p.encode() for p in pieces]
    codec = TextCodec(table, lambda text: [])
    tags = [fmt.fork_tag, fmt.outline_tag or "", fmt.child_end_tag or ""]
    rng = random.Random(name)
    for may_fork, ends in ((True, False), (False, True)):
        for _ in range(20):
            text = "x y 1: a" + "".join(rng.choice([*tags, "1: a", "2: bc", " x y", "\n"])
                                        for _ in range(30))
            ids, rest = [], text
            while rest:  # greedy longest-piece split
                piece = max((p for p in pieces if rest.startswith(p)), key=len, default=None)
                if piece is None:
                    rest = rest[1:]
                    continue
                ids.append(pieces.index(piece))
                rest = rest[len(piece):]
            every = TagFormatScanner(fmt, codec, may_fork=may_fork, ends_at_tag=ends,
                                     max_children=99)
            quiet = TagFormatScanner(fmt, codec, may_fork=may_fork, ends_at_tag=ends,
                                     max_children=99)
            if quiet.needs_history:
                quiet.fed_to = 7  # (as the engine's admission sets it)
            want, got, skipped, pos = [], [], 0, 7
            while pos - 7 < len(ids):
                step = ids[pos - 7:pos - 7 + rng.randint(1, 3)]
                want += every.feed(step, pos)
                watched = quiet.watched_ids()
                if watched is not None and watched.isdisjoint(step):
                    skipped += 1
                else:  # (as HookState.scan does)
                    start, tokens = pos, step
                    if quiet.needs_history and quiet.fed_to is not None:
                        tokens = ids[quiet.fed_to - 7:pos - 7] + step
                        start = quiet.fed_to
                    got += quiet.feed(tokens, start)
                pos += len(step)
            assert got == want
            assert skipped > 0


def test_a_tag_formats_steps_are_scanned_only_where_a_tag_can_end():
    """The engine scans a request's step only when one of its tokens holds
    a byte a tag ends with (``watched_ids``: for ThreadWeaver's tags, ``>``);
    the tokens of the steps between are fed then, in order, so a tag under
    way across skipped steps is found at the token that ends it, at its
    first token's position, and the outline items before it are read."""
    fmt = TagFormat(**{k: v for k, v in expand("threadweaver").items()
                       if k in TagFormat.__dataclass_fields__})
    table = [bytes([b]) for b in range(128)]  # one character a token
    codec = TextCodec(table, lambda text: [])
    scanner = TagFormatScanner(fmt, codec, may_fork=True, ends_at_tag=False, max_children=9)
    watched = scanner.watched_ids()
    assert watched == {ord(">")}
    text = "Plan:\n<Outlines>\n<Outline>1: a</Outline>\n<Outline>2: b</Outline>\n</Outlines>"
    ids = [ord(c) for c in text]
    scanner.fed_to = 0
    events, scans = [], 0
    for pos, tok in enumerate(ids):
        if tok not in watched:
            continue  # a quiet step: nothing fed now
        scans += 1
        events += scanner.feed(ids[scanner.fed_to:pos + 1], scanner.fed_to)
    assert scans == text.count(">")
    (fork,) = events
    assert isinstance(fork, ForkReached)
    assert fork.pos == len(text) - 1 and fork.labels == ("1", "2")
    assert fork.tag_start == text.index("</Outlines>")
