"""docs/test_inventory.md lists every test function and where the checks
of each merged or removed test now live (tests/support/suite_inventory.py)."""

from __future__ import annotations

from tests.support import suite_inventory as inventory


def test_the_inventory_page_matches_the_test_files():
    assert inventory.problems(inventory.PAGE.read_text(), inventory.functions_by_file()) == []


def test_a_test_that_disappears_without_a_line_is_caught(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_kept():\n    pass\n")
    before = inventory.listing({"tests/test_a.py": ["test_kept", "test_gone"]})
    page = f"# x\n\n{inventory.MOVED_HEADING}\n\n{before}"
    found = inventory.functions_by_file(tmp_path)
    assert found == {"tests/test_a.py": ["test_kept"]}
    assert inventory.removed_since(page, found) == ["tests/test_a.py::test_gone"]
    assert inventory.problems(page, found)  # the 'Tests' part is stale
    moved = page.replace(
        f"{inventory.MOVED_HEADING}\n",
        f"{inventory.MOVED_HEADING}\n\n- tests/test_a.py::test_gone -> tests/test_a.py::test_nowhere: merged\n")
    fixed = moved.replace(before, inventory.listing(found))
    assert inventory.problems(fixed, found) == [
        "tests/test_a.py::test_gone -> tests/test_a.py::test_nowhere: "
        "tests/test_a.py::test_nowhere does not exist"]
    assert inventory.problems(fixed.replace("test_nowhere", "test_kept"), found) == []
