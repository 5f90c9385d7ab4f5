"""The KV cache's memory on vLLM's CPU platform when the user sets none
(vllm_seqhooks.engine.cpu_memory): vLLM's default where it fits, half of
what is available where vLLM would refuse to start, the user's choice
always kept; through ``vllm serve``'s flags as through ``LLM``'s keywords."""

from __future__ import annotations

import pytest

from vllm_seqhooks.engine import cpu_memory

GIB = 1 << 30


def test_vllms_default_is_kept_where_it_fits():
    assert cpu_memory.default_kv_cache_bytes(64 * GIB, 62 * GIB, 0.92) is None
    # fits now, but not once vLLM's own processes have started (seen: 7.87 GiB of a
    # NUMA node's 8.34 available before the start, 7.02 when the worker checked)
    assert cpu_memory.default_kv_cache_bytes(int(8.34 * GIB), int(7.87 * GIB), 0.92) is not None


def test_where_vllm_would_refuse_half_the_available_memory():
    # the machine of the report: 13.37 of 14.71 GiB available, 0.92 asks 13.54
    got = cpu_memory.default_kv_cache_bytes(int(14.71 * GIB), int(13.37 * GIB), 0.92)
    assert got == int(13.37 * GIB) // 2 // (1 << 20) * (1 << 20)


def test_the_node_vllm_checks():
    """The memory node of the first allowed CPU, as vLLM's CPU worker reads
    it (on a multi-node machine, less than the whole)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    node = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
    total, available = cpu_memory.memory_of_first_node()
    assert total == node.total_memory
    assert available == pytest.approx(node.available_memory, rel=0.05)


@pytest.fixture
def short_of_memory(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(cpu_memory, "memory_of_first_node",
                        lambda: (int(14.71 * GIB), int(13.37 * GIB)))


def test_engine_arguments(short_of_memory, monkeypatch, caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="vllm.seqhooks.cpu_memory"):
        got = cpu_memory.cpu_memory_args({})
    assert got["kv_cache_memory_bytes"] == pytest.approx(13.37 * GIB / 2, rel=1e-3)
    assert "--kv-cache-memory-bytes" in caplog.text
    assert cpu_memory.cpu_memory_args({"gpu_memory_utilization": 0.92}) == got
    # the user's own settings are never replaced
    assert cpu_memory.cpu_memory_args({"kv_cache_memory_bytes": 1 << 26}) == {}
    assert cpu_memory.cpu_memory_args({"gpu_memory_utilization": 0.5}) == {}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    assert cpu_memory.cpu_memory_args({}) == {}


def test_serve_flags(short_of_memory, tiny_model_dir):
    """``vllm serve MODEL --seqhooks ...`` without memory flags starts on a
    machine where vLLM's default would be refused; with them, as given."""
    from tests.test_plugin import serve_parser


    hooks = ["--sync-token-id", "6", "--promise-token-id", "4"]
    ns = serve_parser().parse_args([tiny_model_dir, *hooks])
    assert ns.kv_cache_memory_bytes == pytest.approx(13.37 * GIB / 2, rel=1e-3)
    ns = serve_parser().parse_args([tiny_model_dir, *hooks, "--kv-cache-memory-bytes", "1048576"])
    assert ns.kv_cache_memory_bytes == 1048576
    ns = serve_parser().parse_args([tiny_model_dir])  # no hooks: stock vLLM, untouched
    assert ns.kv_cache_memory_bytes is None
