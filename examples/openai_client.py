"""Talk to `vllm serve ... --sync-token ... --promise-token ...` with the
official openai client: a streamed completion whose merged child outputs
arrive right after <sync>, then the request's fork/join tree.

Start a server first. With a model trained to write the hook tokens:

    vllm serve MODEL --sync-token '<sync>' --promise-token '<promise>' --promise-end-token '</promise>'
    python examples/openai_client.py --url http://127.0.0.1:8000 --prompt "..."

With the project's tiny random-weight model (it does not write hook tokens
by itself, so this example forces them with the scripted logits processor):

    python -m vllm_seqhooks.scripted.tiny_model /tmp/tiny
    vllm serve /tmp/tiny --sync-token '<sync>' --promise-token '<promise>' \\
        --promise-end-token '</promise>' --enforce-eager --dtype float32 \\
        --max-model-len 1024 --block-size 32 --kv-cache-memory-bytes 67108864 \\
        --logits-processors vllm_seqhooks.scripted.processor:ScriptedTokensLogitsProcessor
    python examples/openai_client.py --url http://127.0.0.1:8000 --scripted-tiny
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

from vllm_seqhooks import format_tree
from vllm_seqhooks.core.trace import decorate


def detokenize(url: str, model: str, ids: list[int]) -> str:
    """Text of token ids, from vLLM's ``/detokenize`` endpoint."""
    import httpx

    r = httpx.post(url + "/detokenize", json={"model": model, "tokens": ids}, timeout=60)
    r.raise_for_status()
    return r.json()["prompt"]


def scripted_xargs(model: str) -> dict:
    """vllm_xargs that make the tiny model fork two children and join them."""
    from transformers import AutoTokenizer

    from vllm_seqhooks.scripted.processor import encode_script

    tok = AutoTokenizer.from_pretrained(model)
    S = lambda text: encode_script(tok, text)  # noqa: E731
    return {
        "seqhooks_script": S("Plan:<promise>flights</promise><promise>hotel</promise><sync> Done."),
        "seqhooks_script_end": "eos",
        "seqhooks_eos_token_id": tok.eos_token_id,
        "seqhooks_child_scripts": json.dumps({"0": S("Flight AB12"), "1": S("Hotel Rose")}),
        "seqhooks_child_script_end": "eos",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--prompt", default="Plan a trip:")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--scripted-tiny", action="store_true",
                        help="force hook tokens on the tiny test model")
    args = parser.parse_args()

    client = OpenAI(base_url=args.url + "/v1", api_key="EMPTY")
    model = client.models.list().data[0].id
    extra = {"vllm_xargs": scripted_xargs(model)} if args.scripted_tiny else {}

    print("streamed:")
    stream = client.completions.create(model=model, prompt=args.prompt, temperature=0,
                                       max_tokens=args.max_tokens, stream=True,
                                       extra_body=extra)
    for chunk in stream:
        if chunk.choices:
            print(chunk.choices[0].text, end="", flush=True)
    print()

    # The same request without streaming, to read its fork/join tree.
    resp = client.completions.create(model=model, prompt=args.prompt, temperature=0,
                                     max_tokens=args.max_tokens, extra_body=extra)
    print("text:", repr(resp.choices[0].text))
    trace = (resp.model_extra.get("kv_transfer_params") or {}).get("seqhooks")
    if trace:  # the trace carries token ids; the server's /detokenize gives their text
        decorate(trace, lambda ids: detokenize(args.url, model, ids))
    print(format_tree(trace))
    if trace:
        print("usage:", trace["usage"])


if __name__ == "__main__":
    main()
