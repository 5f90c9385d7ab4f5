"""Calls into a GPU-timed engine's worker between runs: vLLM's
``collective_rpc``, on an in-process ``LLM`` or over HTTP for a server
(``POST /collective_rpc``, which ``vllm serve`` offers with
``VLLM_SERVER_DEV_MODE=1``)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def call(engine, method: str, *args: Any) -> list[Any]:
    """The worker's ``method`` on ``engine`` (a server's URL or an ``LLM``):
    one result per worker. Over HTTP the arguments go as strings, and vLLM
    returns a result that is not a list or dict as a string."""
    if not isinstance(engine, str):
        return engine.collective_rpc(method, args=args)
    body = json.dumps({"method": method, "args": [str(a) for a in args]}).encode()
    req = urllib.request.Request(engine + "/collective_rpc", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read()).get("results") or []
