"""What a child takes of its parent's sampling parameters: one rule per
``SamplingParams`` field (``vllm_seqhooks/core/child_params.py``), each
row checked on the installed vLLM's fields, and the docs' table is that
table. No engine: ``spawning._child_params`` on a parent's parameters."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_seqhooks.core.child_params import CHILD_PARAMS, CLEAR, CLEARED, FRONTEND, INHERIT, OWN

ROOT = Path(__file__).resolve().parents[1]


def _fields() -> tuple[str, ...]:
    from vllm import SamplingParams

    return SamplingParams.__struct_fields__


def test_every_field_of_the_installed_vllm_has_a_rule():
    from vllm_seqhooks.core.child_params import unruled
    from vllm_seqhooks.engine.vllm_private.scheduler import _child_params_problems

    assert unruled(_fields()) == []
    assert _child_params_problems() == []  # (what the engine checks at start-up)
    assert unruled([*_fields(), "a_new_field"]) == ["a_new_field"]


def _child_of(**fields):
    from vllm import SamplingParams

    from vllm_seqhooks.engine.spawning import _child_params

    sp = SamplingParams(max_tokens=50)
    for name, value in fields.items():
        setattr(sp, name, value)  # (msgspec: no validation, any marker value)
    return sp, _child_params(SimpleNamespace(sampling_params=sp), budget=8, key="1.0")


@pytest.mark.parametrize("name", sorted(n for n in CHILD_PARAMS if CHILD_PARAMS[n][0] != OWN))
def test_a_field_is_inherited_cleared_or_left_unread_as_its_row_says(name):
    if name not in _fields():
        pytest.skip(f"this vLLM has no SamplingParams.{name}")
    marker = object()
    parent, child = _child_of(**{name: marker})
    rule = CHILD_PARAMS[name][0]
    if rule in (INHERIT, FRONTEND):
        assert getattr(child, name) is marker
    else:
        assert rule == CLEAR and getattr(child, name) == CLEARED[name]
    assert getattr(parent, name) is marker  # the caller's parameters are never changed


def test_the_fields_the_engine_sets_for_each_child():
    from vllm_seqhooks.config.request_keys import CHILD_KEY_ARG, SAMPLED_BEFORE_ARG
    from vllm_seqhooks.core.request_tree import derive_seed

    extra = {"user": 1, SAMPLED_BEFORE_ARG: 7}
    parent, child = _child_of(n=3, seed=1234, extra_args=extra)
    assert (child.n, child.max_tokens) == (1, 8)
    assert child.seed == derive_seed(1234, "1.0")
    assert child.extra_args == {"user": 1, CHILD_KEY_ARG: "1.0"}
    assert parent.extra_args is extra and extra == {"user": 1, SAMPLED_BEFORE_ARG: 7}
    _, unseeded = _child_of(seed=None)
    assert unseeded.seed is None
    assert {n for n, (rule, _why) in CHILD_PARAMS.items() if rule == OWN} == {
        "n", "max_tokens", "seed", "extra_args"}


def test_the_docs_table_is_the_code_table():
    """docs/request_features.md lists each field with its rule and why, as
    ``CHILD_PARAMS`` says (the page states nothing the code does not do)."""
    page = (ROOT / "docs" / "request_features.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|$", page, re.M)
    words = {INHERIT: "the parent's", OWN: "its own", CLEAR: "cleared", FRONTEND: "not read"}
    expected = [(name, words[rule] + (f" (`{CLEARED[name]!r}`)" if rule == CLEAR else ""), why)
                for name, (rule, why) in CHILD_PARAMS.items()]
    assert [(n, got.strip(), why.strip()) for n, got, why in rows] == expected
