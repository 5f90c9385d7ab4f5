#!/usr/bin/env python
"""Train an embedded fork/join model from scratch, on CPU.

``--task promise`` (the default; the model shipped in
``vllm_seqhooks/data/forkjoin_model/``) and ``--task threadweaver``
(``vllm_seqhooks/data/threadweaver_model/``, the same sorting in ThreadWeaver's
tag format, see ``vllm_seqhooks/tasks/threadweaver.py`` and
``docs/threadweaver_model.md``) share everything below but the data.

Where it writes: ``--out DIR``; without it, a user cache,
``${XDG_CACHE_HOME:-~/.cache}/vllm-seqhooks/models/forkjoin_model`` (or
``threadweaver_model``), never the shipped model: that one is replaced only
when ``--out`` names it (``--out vllm_seqhooks/data/forkjoin_model``).  Run the
demo on what it wrote with ``python -m vllm_seqhooks --model DIR``.

The promise task (``vllm_seqhooks/tasks/forkjoin.py``): sort up to 16 digits; lists of
more than 4 digits are split by the model itself into ``<promise>`` chunks of 4,
followed by ``<sync>``; the engine runs one child per chunk (payload context,
prompt ``"sort {payload}="``), appends the sorted chunks after ``<sync>``, and
the parent writes ``=`` and the merged list.

Model: a Llama (``LlamaForCausalLM``, hidden 256, 4 layers, 4 heads of 64,
2 KV heads) over the character-level tokenizer of
``vllm_seqhooks.scripted.tiny_model`` (same hook token ids: ``<promise>`` 4,
``</promise>`` 5, ``<sync>`` 6, EOS 2, BOS 1).

Training: teacher forcing on an endless stream of generated problems (fixed
seed, fixed order). Each batch mixes parent sequences (BOS, prompt, the
parent's output with the merged children text, EOS) and child sequences (no
BOS, as the engine builds them: ``"sort " + chunk + "="``, sorted chunk, EOS).
The loss covers only what a request samples itself: not the prompt, and not
the merged tokens after ``<sync>`` (the engine inserts those).  AdamW, linear
warm-up then cosine decay.  Deterministic for a given seed, thread count and
torch version (``torch.use_deterministic_algorithms``, one RNG, fixed order).

Evaluation during training is teacher-forced but exact for greedy decoding:
a problem counts as solved when the argmax at every supervised position of
the parent and of each of its children is the target token; that is exactly
when greedy fork/join decoding writes the expected text.

    .venv/bin/python scripts/train_tiny_forkjoin.py
    # writes ~/.cache/vllm-seqhooks/models/forkjoin_model/ (weights, tokenizer,
    # training.json, seqhooks.json)
    .venv/bin/python scripts/train_tiny_forkjoin.py --task threadweaver
    # writes ~/.cache/vllm-seqhooks/models/threadweaver_model/
    .venv/bin/python scripts/train_tiny_forkjoin.py --out vllm_seqhooks/data/forkjoin_model
    # replaces the shipped model

The threadweaver task's sequences are laid out by the engine's own format code
(``tasks.threadweaver.sequences``: child prompts by ``formats.boundaries.child_prompt``,
merges by ``formats.boundaries.join_tokens``); its tokenizer adds the ten tags as
single tokens (ids 104..113).  A child row there is one child of a random
problem longer than 4 digits (its prompt: the parent's context through
``</Outlines>`` and its header, BOS included), trained on its sorted chunk
and ``</Thread>``.

The shipped model is this command with the defaults (seed 0, 1,500 steps, one
thread; ``--out vllm_seqhooks/data/forkjoin_model`` to replace it): about
17-20 minutes on a shared 2-core CPU; a second run reproduced its weights bit
for bit.  ``--threads 2`` is faster on an idle machine but
gives other weights (float reductions depend on the thread count).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vllm_seqhooks.tasks import forkjoin as forkjoin_task  # noqa: E402
from vllm_seqhooks.tasks import trained_model_dir  # noqa: E402
from vllm_seqhooks.tasks import threadweaver as threadweaver_task  # noqa: E402
from vllm_seqhooks.scripted import tiny_model as tm  # noqa: E402

ARCH = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=512,
)
MAX_POSITIONS = 256
IGNORE = -100


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

_CHAR_IDS = {c: i for i, c in enumerate(tm.CHARS, start=len(tm.FIXED_TOKENS))}
_HOOK_IDS = {tm.PROMISE_TOKEN: tm.PROMISE_ID, tm.PROMISE_END_TOKEN: tm.PROMISE_END_ID,
             tm.SYNC_TOKEN: tm.SYNC_ID}


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (the tokenizer's, without BOS; checked against
    ``tokenizers`` in :func:`check_encoding`)."""
    out: list[int] = []
    i = 0
    while i < len(text):
        for tok, tid in _HOOK_IDS.items():
            if text.startswith(tok, i):
                out.append(tid)
                i += len(tok)
                break
        else:
            out.append(_CHAR_IDS[text[i]])
            i += 1
    return out


def parent_example(digits: str) -> tuple[list[int], list[int]]:
    """(input ids, per-token loss flag) of a promise-task parent sequence."""
    ids = [tm.BOS_ID] + encode(forkjoin_task.prompt_text(digits))
    train = [0] * len(ids)
    for seg in forkjoin_task.parent_segments(digits):
        seg_ids = encode(seg.text)
        ids += seg_ids
        train += [0 if seg.merged else 1] * len(seg_ids)
    ids.append(tm.EOS_ID)
    train.append(1)
    return ids, train


def child_example(chunk: str) -> tuple[list[int], list[int]]:
    """A promise-task child sequence, as the engine builds its prompt (no BOS)."""
    prompt = encode(forkjoin_task.child_prompt(chunk))
    out = encode(forkjoin_task.solve(chunk)) + [tm.EOS_ID]
    return prompt + out, [0] * len(prompt) + [1] * len(out)


class PromiseTask:
    """``--task promise``: ``<promise>``/``<sync>``, children in payload context."""

    name = "promise"
    module = forkjoin_task
    extra_tokens: tuple[str, ...] = ()
    child_frac = 0.2
    description = ("sort up to 16 digits; >4 digits: one <promise> per chunk of 4, <sync>, "
                   "merge (vllm_seqhooks/tasks/forkjoin.py)")

    def check_encoding(self) -> None:
        tok = tm.build_tokenizer()
        for digits in ("7", "3917425", "1234567890123456"):
            text = forkjoin_task.prompt_text(digits) + forkjoin_task.expected_text(digits)
            want = tok.encode(text, add_special_tokens=False).ids
            assert encode(text) == want, (text, encode(text), want)

    def examples(self, digits: str) -> list[tuple[list[int], list[int]]]:
        """The parent's sequence, then each child's."""
        return [parent_example(digits)] + [child_example(c) for c in forkjoin_task.split(digits)]

    def sample_batch(self, rng: random.Random, batch_size: int, child_frac: float):
        """Parents with lengths uniform in 1..MAX_LEN, and children (chunks of
        1..CHUNK digits, no BOS)."""
        examples = []
        for _ in range(batch_size):
            if rng.random() < child_frac:
                n = rng.randint(1, forkjoin_task.CHUNK)
                chunk = "".join(rng.choice("0123456789") for _ in range(n))
                examples.append(child_example(chunk))
            else:
                examples.append(parent_example(forkjoin_task.random_problem(rng).digits))
        return examples


class ThreadWeaverTask:
    """``--task threadweaver``: ThreadWeaver's tags, children in fork context."""

    name = "threadweaver"
    module = threadweaver_task
    extra_tokens = threadweaver_task.TAGS
    child_frac = 0.3
    description = ("sort up to 16 digits in ThreadWeaver's format; >4 digits: one <Outline> "
                   "per chunk of 4, fork at </Outlines>, children <Thread>, <Conclusion> "
                   "(vllm_seqhooks/tasks/threadweaver.py)")

    def __init__(self) -> None:
        self.tokenizer = tm.build_tokenizer(self.extra_tokens)
        self.codec = threadweaver_task.text_codec(self.tokenizer)
        self.fmt = threadweaver_task.tag_format()
        self._cache: dict[str, list[tuple[list[int], list[int]]]] = {}

    def check_encoding(self) -> None:
        for i, tag in enumerate(self.extra_tokens, start=tm.TOKENIZER_SIZE):
            assert self.codec.encode(tag) == (i,), (tag, self.codec.encode(tag))
        for digits in ("7", "3917425", "1234567890123456"):
            text = (threadweaver_task.prompt_text(digits)
                    + threadweaver_task.expected_text(digits, self.fmt))
            ids, _ = self.examples(digits)[0]
            want = [tm.BOS_ID, *self.tokenizer.encode(text, add_special_tokens=False).ids,
                    tm.EOS_ID]
            assert ids == want, (text, ids, want)

    def examples(self, digits: str) -> list[tuple[list[int], list[int]]]:
        """The parent's sequence, then each child's (the engine's layout)."""
        got = self._cache.get(digits)
        if got is None:
            got = [(list(e.ids), list(e.train)) for e in threadweaver_task.sequences(
                self.codec, digits, tm.BOS_ID, tm.EOS_ID, self.fmt)]
            if len(self._cache) < 100_000:
                self._cache[digits] = got
        return got

    def sample_batch(self, rng: random.Random, batch_size: int, child_frac: float):
        """Parents with lengths uniform in 1..MAX_LEN, and children: one child,
        chosen uniformly, of a problem longer than CHUNK digits."""
        examples = []
        for _ in range(batch_size):
            if rng.random() < child_frac:
                p = threadweaver_task.random_problem(rng, min_len=threadweaver_task.CHUNK + 1)
                children = self.examples(p.digits)[1:]
                examples.append(children[rng.randrange(len(children))])
            else:
                examples.append(self.examples(threadweaver_task.random_problem(rng).digits)[0])
        return examples


TASKS = {"promise": PromiseTask, "threadweaver": ThreadWeaverTask}


def length_buckets(examples, n: int):
    """``examples`` sorted by length (stable) and cut into ``n`` parts."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    size = -(-len(order) // n)
    return [[examples[i] for i in order[k : k + size]] for k in range(0, len(order), size)]


def collate(examples, torch):
    """Right-padded inputs and shifted labels (IGNORE where not trained)."""
    width = max(len(ids) for ids, _ in examples) - 1
    inputs = torch.full((len(examples), width), tm.PAD_ID, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for row, (ids, train) in enumerate(examples):
        n = len(ids) - 1
        inputs[row, :n] = torch.tensor(ids[:-1])
        tgt = torch.tensor(ids[1:])
        keep = torch.tensor(train[1:], dtype=torch.bool)
        labels[row, :n] = torch.where(keep, tgt, torch.full_like(tgt, IGNORE))
    return inputs, labels


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def hf_config_dict() -> dict:
    cfg = tm.model_config("tiny", "float32")
    cfg.update(ARCH)
    cfg["head_dim"] = ARCH["hidden_size"] // ARCH["num_attention_heads"]
    cfg["max_position_embeddings"] = MAX_POSITIONS
    cfg["initializer_range"] = 0.02
    return cfg


def build_model(torch, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**hf_config_dict())
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    model.config._attn_implementation = "sdpa"
    return model


def evaluate(model, problems, torch, task, batch_size: int = 256) -> dict:
    """Greedy-exact teacher-forced evaluation (see the module docstring)."""
    model.eval()
    seqs: list[tuple[int, list[int], list[int]]] = []  # (problem index, ids, train)
    for i, p in enumerate(problems):
        for ids, train in task.examples(p.digits):
            seqs.append((i, ids, train))
    ok = [True] * len(problems)
    tok_right = tok_total = 0
    with torch.no_grad():
        for s in range(0, len(seqs), batch_size):
            part = seqs[s : s + batch_size]
            inputs, labels = collate([(ids, tr) for _, ids, tr in part], torch)
            logits = model(input_ids=inputs).logits
            pred = logits.argmax(-1)
            mask = labels != IGNORE
            right = (pred == labels) | ~mask
            tok_right += int(((pred == labels) & mask).sum())
            tok_total += int(mask.sum())
            for row, (i, _, _) in enumerate(part):
                if not bool(right[row].all()):
                    ok[i] = False
    model.train()
    n_ok = sum(ok)
    return {
        "n": len(problems),
        "greedy_exact": n_ok / len(problems),
        "token_accuracy": tok_right / max(1, tok_total),
        "failed": [problems[i].digits for i, good in enumerate(ok) if not good][:20],
    }


def lr_at(step: int, steps: int, lr: float, warmup: int, min_ratio: float = 0.05) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def save_model(model, out: Path, info: dict, torch, dtype: str, task) -> None:
    """Write a model directory vLLM and transformers load offline."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        from safetensors.torch import save_file

        sd = {k: v.detach().to(getattr(torch, dtype)).contiguous()
              for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = hf_config_dict()
        cfg["torch_dtype"] = cfg["dtype"] = dtype
        (tmp / "config.json").write_text(tm._dump_json(cfg))
        gen_cfg = {"bos_token_id": tm.BOS_ID, "eos_token_id": tm.EOS_ID,
                   "pad_token_id": tm.PAD_ID}
        (tmp / "generation_config.json").write_text(tm._dump_json(gen_cfg))
        tok = tm.build_tokenizer(task.extra_tokens)
        (tmp / "tokenizer.json").write_text(
            tm._dump_json(json.loads(tok.to_str())), encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(
            tm._dump_json(tm._tokenizer_config(task.extra_tokens,
                                              task.module.CHAT_TEMPLATE)))
        special_map = {"bos_token": tm.BOS_TOKEN, "eos_token": tm.EOS_TOKEN,
                       "pad_token": tm.PAD_TOKEN, "unk_token": tm.UNK_TOKEN}
        (tmp / "special_tokens_map.json").write_text(tm._dump_json(special_map))
        (tmp / "training.json").write_text(json.dumps(info, indent=2) + "\n")
        # The hook protocol travels with the model (special_kwargs="auto").
        (tmp / "seqhooks.json").write_text(
            json.dumps(task.module.SEQHOOKS_JSON, indent=2) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        os.chmod(tmp, 0o755)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------


def output_dir(args: argparse.Namespace) -> Path:
    """The model directory the run writes: ``--out``, else the task's
    directory in the user cache (never the shipped model by default)."""
    if args.out is not None:
        return args.out
    return trained_model_dir(TASKS[args.task].module.MODEL_DIR.name)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(TASKS), default="promise")
    ap.add_argument("--out", type=Path, default=None,
                    help="model directory to write (default: "
                         f"{trained_model_dir(forkjoin_task.MODEL_DIR.name)}, or "
                         f"{trained_model_dir(threadweaver_task.MODEL_DIR.name)} with --task "
                         "threadweaver; "
                         "the shipped model in vllm_seqhooks/data/ is replaced only when "
                         "--out names it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--child-frac", type=float, default=None,
                    help="share of child sequences in a batch (default: the task's, "
                         "promise 0.2, threadweaver 0.3)")
    ap.add_argument("--micro-batches", type=int, default=3,
                    help="split each batch by length into this many forward passes")
    ap.add_argument("--save-every", type=int, default=0,
                    help="also write a checkpoint model directory every N steps")
    ap.add_argument("--checkpoint-dir", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                    help="dtype of the saved weights (training is float32)")
    ap.add_argument("--no-save", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)

    task = TASKS[args.task]()
    args.out = output_dir(args)
    if args.child_frac is None:
        args.child_frac = task.child_frac

    import torch

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    task.check_encoding()
    if not args.no_save:
        print(f"will write the model to {args.out}", flush=True)

    model = build_model(torch, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    rng = random.Random(args.seed)
    # Validation problems come from their own seed, apart from the held-out
    # set of the evaluation scripts (HELDOUT_SEED of the task module).
    val = task.module.generate_problems(args.eval_size, seed=args.seed + 1_000_003)
    print(f"model: {n_params:,} parameters, {ARCH}; threads {args.threads}", flush=True)

    t0 = time.perf_counter()
    history = []
    ema = None
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        batch = task.sample_batch(rng, args.batch_size, args.child_frac)
        n_target = sum(sum(tr[1:]) for _, tr in batch)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        # Micro-batches of similar lengths (less padding); the loss is the
        # mean over all target tokens of the batch.
        for part in length_buckets(batch, args.micro_batches):
            inputs, labels = collate(part, torch)
            logits = model(input_ids=inputs).logits
            part_loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                ignore_index=IGNORE, reduction="sum") / n_target
            part_loss.backward()
            loss_sum += part_loss.item()
        loss = torch.tensor(loss_sum)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:5d}  loss {loss.item():.4f}  ema {ema:.4f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}  {time.perf_counter() - t0:7.1f}s",
                  flush=True)
        if args.save_every and (step + 1) % args.save_every == 0 and args.checkpoint_dir:
            save_model(model, args.checkpoint_dir / f"step{step + 1}",
                       {"step": step + 1, "seed": args.seed}, torch, args.dtype, task)
        if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
            ev = evaluate(model, val, torch, task)
            history.append({"step": step + 1, "loss_ema": round(ema, 5),
                            "greedy_exact": ev["greedy_exact"],
                            "token_accuracy": round(ev["token_accuracy"], 5),
                            "seconds": round(time.perf_counter() - t0, 1)})
            print(f"  eval @ {step + 1}: greedy-exact {ev['greedy_exact']:.4f}  "
                  f"token acc {ev['token_accuracy']:.5f}  failed e.g. {ev['failed'][:5]}",
                  flush=True)
    train_s = time.perf_counter() - t0
    final = evaluate(model, val, torch, task)
    # The weights as saved (rounded to --dtype), evaluated in float32.
    saved = build_model(torch, args.seed)
    saved.load_state_dict({k: v.to(getattr(torch, args.dtype)).float()
                           for k, v in model.state_dict().items()})
    final_saved = evaluate(saved, val, torch, task)
    print(f"validation: float32 weights {final['greedy_exact']:.4f}, saved {args.dtype} "
          f"weights {final_saved['greedy_exact']:.4f} (failed e.g. {final_saved['failed'][:5]})")
    info = {
        "task": task.description,
        "command": "python scripts/train_tiny_forkjoin.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "seed": args.seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "warmup": args.warmup,
        "weight_decay": args.weight_decay,
        "child_frac": args.child_frac,
        "micro_batches": args.micro_batches,
        "threads": args.threads,
        "architecture": ARCH,
        "parameters": n_params,
        "saved_dtype": args.dtype,
        "final_loss_ema": round(ema, 6),
        "final_loss": round(loss.item(), 6),
        "train_seconds": round(train_s, 1),
        "validation": {"n": final["n"], "seed": args.seed + 1_000_003,
                       "greedy_exact_teacher_forced": final["greedy_exact"],
                       "token_accuracy": round(final["token_accuracy"], 6),
                       "greedy_exact_teacher_forced_saved_weights": final_saved["greedy_exact"]},
        "history": history,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }
    print(json.dumps({k: v for k, v in info.items() if k != "history"}, indent=2))
    if not args.no_save:
        save_model(model, args.out, info, torch, args.dtype, task)
        print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
