"""The optional C extension (vllm_seqhooks/native/_rows.c); everything else
is in pyproject.toml. Without a C compiler the install goes on without it
and the pure-Python implementations run (see vllm_seqhooks/native)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("vllm_seqhooks.native._rows",
                             sources=["vllm_seqhooks/native/_rows.c"],
                             extra_compile_args=["-O2"], optional=True)])
