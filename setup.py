"""The optional C extension (vllm_seqhooks/native/*.c); everything else
is in pyproject.toml. Without a C compiler the install goes on without it
and the pure-Python implementations run (see vllm_seqhooks/native)."""

from setuptools import Extension, setup

NATIVE = "vllm_seqhooks/native"

setup(ext_modules=[Extension(
    "vllm_seqhooks.native._rows",
    sources=[f"{NATIVE}/{name}.c" for name in ("_rows", "moves", "batch_rows", "grouping")],
    depends=[f"{NATIVE}/moves.h"], extra_compile_args=["-O2"], optional=True)])
