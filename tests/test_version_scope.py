"""Which test modules the vLLM 0.33 part leaves out (they reach no vLLM)."""

from __future__ import annotations

from pathlib import Path

from tests.support.version_scope import ROOT, is_vllm_independent


def _module(tmp_name: str, text: str) -> Path:
    path = ROOT / "tests" / f"_scope_probe_{tmp_name}.py"
    path.write_text(text)
    return path


def test_modules_that_reach_vllm_are_kept(request):
    probes = {
        "pure": "from vllm_seqhooks.core.join_plan import resumes\n",
        "direct": "def test():\n    from vllm import SamplingParams\n",
        "through_package": "from vllm_seqhooks.engine.spawning import Spawning\n",
        "lazy_llm": "def test():\n    from vllm_seqhooks import LLM\n",
        "command": "CMD = ['vllm', 'serve', 'm']\n",
        "demo": "CMD = ['python', '-m', 'vllm_seqhooks']\n",
        "docstring_only": '"""Runs `vllm serve` in the docs."""\nfrom vllm_seqhooks.config import presets\n',
    }
    paths = {name: _module(name, text) for name, text in probes.items()}
    try:
        got = {name: is_vllm_independent(path) for name, path in paths.items()}
    finally:
        for path in paths.values():
            path.unlink()
    assert got == {"pure": True, "direct": False, "through_package": False, "lazy_llm": False,
                   "command": False, "demo": False, "docstring_only": True}


def test_the_suite_s_engine_tests_are_never_left_out():
    for name in ("test_scheduler_surgical", "test_forkjoin_e2e", "test_serve",
                 "test_request_features", "test_vllm_private", "test_readme_snippets"):
        assert not is_vllm_independent(ROOT / "tests" / f"{name}.py"), name


def test_every_end_to_end_test_the_033_part_lists_exists():
    """A renamed or removed test must not drop out of the vLLM 0.33 part
    silently: each entry names a test file, and a test function in it."""
    from tests.support.version_scope import END_TO_END_ON_EVERY_RELEASE

    for entry in END_TO_END_ON_EVERY_RELEASE:
        path, _, test = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        if test:
            assert f"def {test.split('[', 1)[0]}(" in (ROOT / path).read_text(), entry


def test_the_tools_left_to_one_release_exist_and_say_why():
    from tests.support.version_scope import TOOLS_CHECKED_ON_ONE_RELEASE

    for path, reason in TOOLS_CHECKED_ON_ONE_RELEASE.items():
        assert (ROOT / path).is_file() and reason, path
        assert is_vllm_independent(ROOT / path), path
