"""RequestTree: the fork/join request tree."""

from vllm_seqhooks.core.request_tree import ABORTED, FAILED, FINISHED, MERGED, RequestTree
from vllm_seqhooks.core.trace import build_trace


def make_family(dm):
    dm.ensure_root("p")
    a = dm.new_child_id("p")
    dm.add_child("p", a, [1], 5)
    b = dm.new_child_id("p")
    dm.add_child("p", b, [2], 6)
    return a, b


def test_keys_depths_and_order():
    dm = RequestTree()
    a, b = make_family(dm)
    assert [dm.get(c).key for c in (a, b)] == ["0", "1"]
    g = dm.new_child_id(a)
    dm.add_child(a, g, [3], 7)
    assert dm.get(g).key == "0.0" and dm.get(g).depth == 2
    assert dm.subtree("p") == [a, g, b]
    assert dm.is_child(a) and not dm.is_child("p")


def test_join_waits_for_all_open_children():
    dm = RequestTree()
    a, b = make_family(dm)
    assert dm.child_ended(a, FINISHED, [10, 11], "stop") is None
    assert not dm.ready_to_join("p")
    assert dm.child_ended(b, FINISHED, [12], "length") == "p"
    merged, kids = dm.take_merge("p", [99])
    assert merged == [10, 11, 99, 12] and kids == [a, b]
    assert not dm.has_open_children("p")
    assert dm.get(a).state == MERGED
    assert dm.get("p").joins[0].merged_tokens == 4


def test_the_parent_is_reported_at_its_last_open_child_only():
    """(Whether it waits for them, and so joins then, is the engine's
    lifecycle's to say: ForkJoinState.waits_for_children.)"""
    dm = RequestTree()
    a, b = make_family(dm)
    assert dm.child_ended(a, FINISHED, [1], "stop") is None
    assert dm.child_ended(b, FINISHED, [2], "stop") == "p"
    assert dm.ready_to_join("p")


def test_failed_children_contribute_marker_or_nothing():
    dm = RequestTree()
    a, b = make_family(dm)
    dm.child_ended(a, FAILED, [5, 5], "error")
    dm.child_ended(b, FINISHED, [7], "stop")
    merged, _ = dm.take_merge("p", [0], failed_marker=[66])
    assert merged == [66, 0, 7]
    dm2 = RequestTree()
    a, b = make_family(dm2)
    dm2.child_ended(a, ABORTED, None, None)
    dm2.child_ended(b, FINISHED, [7], "stop")
    assert dm2.take_merge("p", [0])[0] == [0, 7]


def test_a_child_ends_once():
    dm = RequestTree()
    a, _ = make_family(dm)
    dm.child_ended(a, FINISHED, [1], "stop")
    assert dm.child_ended(a, ABORTED, None, None) is None
    assert dm.get(a).state == FINISHED


def test_pop_tree_forgets_everything_and_trace():
    dm = RequestTree()
    a, b = make_family(dm)
    dm.child_ended(a, FINISHED, [1], "stop")
    dm.child_ended(b, FINISHED, [2], "stop")
    dm.take_merge("p", [])
    nodes = dm.pop_tree("p")
    assert len(dm) == 0
    trace = build_trace(nodes, decode=lambda ids: "".join(chr(65 + i) for i in ids))
    assert [c["key"] for c in trace["children"]] == ["0", "1"]
    assert trace["children"][0]["output"] == "B"
    assert trace["joins"][0]["children"] == ["0", "1"]
