"""A directory to put first on ``PYTHONPATH``: its ``sitecustomize`` registers
a stub ``"cpu"`` Triton backend at interpreter start-up (see
``sitecustomize.py`` and :mod:`tests.support.v2_runner`)."""
