"""The suite's per-file table: start-ups read back from the log the tests'
plugin writes (tests/support/startup_log.py)."""

from __future__ import annotations

from collections import Counter

from tests.support import startup_log


def test_counts_and_table(tmp_path, monkeypatch):
    log = tmp_path / "startups.log"
    monkeypatch.setenv(startup_log.ENV_VAR, str(log))
    for test, kind in (("tests/test_a.py::test_x", "engine"), ("tests/test_a.py::test_y", "engine"),
                       ("tests/test_b.py::test_z[p]", "serve"), ("tests/test_b.py::test_z[p]", "engine")):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"{test} (call)")
        startup_log._record(kind)
    starts = startup_log.counts(str(log))
    assert starts == {"tests/test_a.py": Counter(engine=2),
                      "tests/test_b.py": Counter(serve=1, engine=1)}
    text = startup_log.table({"tests/test_a.py": 3.0, "tests/test_b.py": 40.2, "tests/test_c.py": 1.0},
                             starts, Counter({"tests/test_a.py": 2, "tests/test_b.py": 1,
                                              "tests/test_c.py": 9}))
    rows = text.splitlines()
    assert rows[2:] == ["| `tests/test_b.py` | 40 | 1 | 1 | 1 |",
                        "| `tests/test_a.py` | 3 | 2 | 2 | 0 |",
                        "| `tests/test_c.py` | 1 | 9 | 0 | 0 |",
                        "| all | 44 | 12 | 3 | 1 |"]


def test_nothing_is_recorded_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(startup_log.ENV_VAR, raising=False)
    startup_log.register()  # (imports nothing, wraps nothing)
    startup_log._record("engine")
    assert startup_log.counts(str(tmp_path / "none.log")) == {}
