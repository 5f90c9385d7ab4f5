"""Run ThreadWeaver's own SFT orchestrator against a stock ``vllm serve`` and
compare with ``vllm serve --seqhooks threadweaver`` (issue 19, by hand).

ThreadWeaver's code is not part of this repository: give the path of
``threadweaver_sft/src/simple_eval.py`` from a checkout of
facebookresearch/threadweaver. Its two functions ``generate_until_any`` and
``branching_generate`` are taken from that file unchanged and run with the
module globals they read (``client``, ``max_context_length``, the tag
strings, ``eos_id``, one worker). One shim: the script's client reads SGLang's
``matched_stop`` from each choice; vLLM's completions API calls it
``stop_reason`` (None at EOS, where SGLang gives the EOS id).

The model: the tiny random Llama widened to Qwen2/3's real tokenizer (tags
are plain text, several tokens each) with the corpus logits processor
(:mod:`tests.support.corpus_model`) standing in for a model trained
on ThreadWeaver-style texts (:mod:`tests.support.threadweaver_texts`):
it continues a context only when the context is the start of one of those
texts, split as the tokenizer splits the whole text, else it writes EOS.

Servers, one after the other on 127.0.0.1:

* ``stock``: plain ``vllm serve``, driven by ``branching_generate``;
* ``native``: ``--seqhooks threadweaver`` with the SFT orchestrator's
  settings (``--merge-suffix '\\n' --child-eos-text '</Thread>'
  --unclosed-child-stop-text ''``), one completion per prompt;
* ``native-ids``: the same with ``--boundary-tokenization ids`` (id-level
  joins: each piece encoded alone).

Usage::

    python scripts/threadweaver_sft_by_hand.py --simple-eval PATH/simple_eval.py \\
        --out docs/formats/threadweaver_sft_by_hand.json
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_seqhooks.engine.serve_flags import hook_flags  # noqa: E402
from tests.support import real_tokenizer_models as rtm  # noqa: E402
from tests.support import real_tokenizers as rt  # noqa: E402
from tests.support.corpus_model import (  # noqa: E402
    CORPUS_ENV, CORPUS_LOGITS_PROCESSOR_FQCN, write_corpus)
from tests.support.server import TINY_FLAGS, start_server  # noqa: E402
from tests.support.threadweaver_texts import FAMILIES, SFT, sft_family  # noqa: E402

MAX_LEN = 1024
FUNCTIONS = ("generate_until_any", "branching_generate")


class _Choices:
    """A completions response whose choices carry SGLang's ``matched_stop``."""

    def __init__(self, client, eos_id: int) -> None:
        self._client = client
        self._eos_id = eos_id

    def create(self, **kwargs):
        out = self._client.completions.create(**kwargs)
        for choice in out.choices:
            reason = getattr(choice, "stop_reason", None)
            choice.matched_stop = (reason if reason is not None
                                   else self._eos_id if choice.finish_reason == "stop" else None)
        return out


class _Client:
    def __init__(self, client, eos_id: int) -> None:
        self.completions = _Choices(client, eos_id)


def load_orchestrator(path: Path, client, eos_id: int) -> dict:
    """``generate_until_any`` and ``branching_generate`` from ThreadWeaver's
    file, with the globals they read."""
    tree = ast.parse(path.read_text())
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)
            and node.name in FUNCTIONS]
    if sorted(d.name for d in defs) != sorted(FUNCTIONS):
        raise SystemExit(f"{path} does not define {FUNCTIONS}")
    namespace = {
        "client": _Client(client, eos_id), "max_context_length": MAX_LEN,
        "thread_end": "</Thread>", "outlines_end": "</Outlines>", "eos_id": eos_id,
        "reasoning_parallel_workers": 1, "ThreadPoolExecutor": ThreadPoolExecutor,
        "concurrent": concurrent, "re": re, "colored": lambda text, *a, **k: text,
    }
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simple-eval", type=Path, required=True,
                        help="threadweaver_sft/src/simple_eval.py of a ThreadWeaver checkout")
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args()

    from openai import OpenAI

    tok = rt.qwen2_tokenizer()
    work = Path(tempfile.mkdtemp(prefix="tw-sft-"))
    families = [sft_family(d) for d in FAMILIES]
    corpus = write_corpus(work / "corpus.json", tok, [t for _, texts in families for t in texts])
    model = str(rtm.build_tiny_model_with_tokenizer(work / "model", tok))
    env = {**os.environ, CORPUS_ENV: str(corpus)}
    base = [*TINY_FLAGS, "--logits-processors", CORPUS_LOGITS_PROCESSOR_FQCN]
    native = hook_flags(SFT)
    runs = {"stock": base, "native": [*base, *native],
            "native-ids": [*base, *native, "--boundary-tokenization", "ids"]}
    results: dict[str, list[dict]] = {}
    for name, flags in runs.items():
        server = start_server(model, *flags, log_path=work / f"{name}.log", env=env)
        try:
            client = OpenAI(base_url=server.url + "/v1", api_key="EMPTY")
            rows = []
            for prompt, texts in families:
                want = texts[0].removesuffix("<|im_end|>")
                if name == "stock":
                    ns = load_orchestrator(args.simple_eval, client, tok.eos_token_id)
                    got = ns["branching_generate"](
                        model, tok, prompt,
                        {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 300})
                else:
                    out = client.completions.create(model=model, prompt=prompt, max_tokens=300,
                                                    temperature=0.0)
                    got = prompt + out.choices[0].text
                rows.append({"prompt": prompt, "text": got, "training_text": got == want})
            results[name] = rows
        finally:
            server.stop()
    same = [{name: results[name][i]["text"] == results["stock"][i]["text"]
             for name in runs if name != "stock"} for i in range(len(families))]
    summary = {f"{name}: training texts": f"{sum(r['training_text'] for r in rows)}/{len(rows)}"
               for name, rows in results.items()}
    summary.update({f"{name}: same text as branching_generate":
                    f"{sum(row[name] for row in same)}/{len(families)}"
                    for name in runs if name != "stock"})
    args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
