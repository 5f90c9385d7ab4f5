"""``python -m vllm_seqhooks.check``'s table and the server start-up it uses
(``vllm_seqhooks.local_server``). (The check itself runs from the installed
wheel: ``tests/test_wheel.py``.)"""

from __future__ import annotations

import pytest


def test_table_format():
    from vllm_seqhooks.check import Result, format_table

    text = format_table([Result("a", "x", True), Result("bb", "yy", False, "why")], "head")
    assert text.splitlines() == [
        "head",
        "config  check  result",
        "a       x      PASS",
        "bb      yy     FAIL  (why)",
        "1 passed, 1 failed",
    ]


def test_a_server_whose_port_was_taken_starts_on_another(monkeypatch, tmp_path):
    """``start_server`` tries another free port when ``vllm serve`` exits
    because the one it was given was bound by someone else first; any
    other exit is raised at once."""
    from vllm_seqhooks import local_server as ls

    tried = []

    def start_command(cmd, port, **kwargs):
        tried.append(port)
        if len(tried) < ls.PORT_ATTEMPTS:
            raise ls.ServerExited("exited", "OSError: [Errno 98] Address already in use")
        return ("server", port)

    ports = iter(range(40001, 40010))
    monkeypatch.setattr(ls, "free_port", lambda: next(ports))
    monkeypatch.setattr(ls, "start_command", start_command)
    assert ls.start_server("m", log_path=tmp_path / "log") == ("server", 40000 + ls.PORT_ATTEMPTS)
    assert tried == list(range(40001, 40001 + ls.PORT_ATTEMPTS))

    def refused(cmd, port, **kwargs):
        tried.append(port)
        raise ls.ServerExited("exited", "ValueError: bad flag")

    tried.clear()
    monkeypatch.setattr(ls, "start_command", refused)
    with pytest.raises(ls.ServerExited, match="exited"):
        ls.start_server("m", log_path=tmp_path / "log")
    assert len(tried) == 1
