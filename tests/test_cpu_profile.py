"""``python -m tests.support.cpu_profile``: the suite's CPU-seconds by kind of
process (docs/testing.md, "How long it takes")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil

from tests.support import cpu_profile

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"


def test_a_commands_processes_and_their_cpu_seconds_are_reported(tmp_path):
    out = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.cpu_profile", "--out", str(out), "--interval", "0.2",
         "--", sys.executable, "-c", f"{BURN}raise SystemExit(3)"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTEST_CURRENT_TEST": "tests/x.py::test_y (call)"})
    assert proc.returncode == 3, proc.stderr  # the command's own status
    data = json.loads(out.read_text())
    burners = [p for p in data["processes"].values()
               if p["cmd"].startswith(f"{sys.executable} -c") and p["cmd"].endswith("SystemExit(3)")]
    assert len(burners) == 1
    # 1.5 CPU-seconds, less what the last interval before its exit missed
    assert 1.0 <= burners[0]["cpu_s"] <= 2.0
    assert burners[0]["test"] == "tests/x.py::test_y (call)"  # the test it was started by
    assert data["wall_s"] >= 1.5
    assert "CPU-seconds sampled" in proc.stderr and " other" in proc.stderr


def test_processes_are_told_apart_by_their_command_lines():
    assert cpu_profile.kind(".venv/bin/python -m pytest -p seqhooks_conformance_plugin "
                            "--seqhooks-mode=hooks") == "upstream scheduler tests (pytest)"
    assert cpu_profile.kind(".venv033/bin/python -m pytest tests -m x") == "pytest (vLLM 0.33 venv)"
    assert cpu_profile.kind("VLLM::EngineCore_DP1") == "spawned vLLM process (EngineCore, worker)"
    assert cpu_profile.kind("python -c from multiprocessing.spawn import spawn_main; "
                            "spawn_main(tracker_fd=5)").startswith("spawned vLLM process")
    assert cpu_profile.kind(".venv/bin/python .venv/bin/vllm serve /m --port 1") == \
        "vllm serve (API server)"
    rows = cpu_profile.by_kind({"1:1": {"cmd": "a", "cpu_s": 1.0}, "2:1": {"cmd": "b", "cpu_s": 2.5},
                                "3:1": {"cmd": "x -m pytest", "cpu_s": 0.5}})
    assert rows == [("other", 3.5, 2), ("pytest", 0.5, 1)]


def test_a_process_that_execs_is_reported_under_its_last_command_line():
    """A process first sampled between its fork and its exec has its parent's
    command line; the report must show what it ran (the CI failure of stop 64:
    the burner above was listed under cpu_profile's own command line)."""
    script = ("import os, sys\nsys.stdin.readline()\n"
              "os.execv(sys.executable, [sys.executable, '-c', 'import sys; sys.stdin.readline()', 'after-exec'])")
    child = subprocess.Popen([sys.executable, "-c", script, "before-exec"], stdin=subprocess.PIPE, text=True)
    try:
        sampler = cpu_profile.Sampler()
        sampler.sample()
        child.stdin.write("\n")
        child.stdin.flush()
        deadline = time.monotonic() + 30
        while psutil.Process(child.pid).cmdline()[-1] != "after-exec":
            assert time.monotonic() < deadline, "the child did not exec"
            time.sleep(0.05)
        sampler.sample()
        seen = [p for p in sampler.processes.values() if p["pid"] == child.pid]
        assert len(seen) == 1 and seen[0]["cmd"].endswith("after-exec"), seen
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=30)
