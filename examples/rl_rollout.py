"""GRPO-style rollout groups from the embedded ThreadWeaver-format model,
and the training rows a trainer takes from them (docs/rl.md).

    python examples/rl_rollout.py                 # 2 problems x 8 samples
    python examples/rl_rollout.py --problems 4 --group 8 --show 2

Each problem is sampled ``--group`` times at temperature 1 (a GRPO group:
one request with ``n = --group``; each sample is its own fork/join family
with its own hook trace). The model decides where to fork; the engine runs
the children and joins them. For every sample it prints the reward (the
answer is right), how many tokens the policy sampled and how many the
engine inserted (``rollout.training_rows``), and for the first ``--show``
samples the ThreadWeaver-style per-call rows (``rollout.per_call_rows``).
"""

from __future__ import annotations

import argparse
import os
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=2)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--show", type=int, default=1, help="samples whose per-call rows to print")
    ap.add_argument("--seed", type=int, default=0,
                    help="picks the problems and seeds the samples (same seed, same rollout)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from vllm import SamplingParams

    from vllm_seqhooks import LLM, rollout
    from vllm_seqhooks.tasks import threadweaver as task

    llm = LLM(str(task.model_dir()), special_kwargs="auto", **task.ENGINE_KWARGS)
    tok = llm.get_tokenizer()
    problems = task.heldout_problems(args.problems, seed=task.HELDOUT_SEED + args.seed)
    # seeded: sample i of a group uses seed + i (vLLM), its children seeds derived from
    # that, so the same --seed gives the same samples run to run
    params = SamplingParams(n=args.group, temperature=1.0, max_tokens=task.PARENT_MAX_TOKENS,
                            seed=args.seed)
    outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)

    shown = 0
    for g, (problem, out) in enumerate(zip(problems, outs)):
        rows = rollout.training_rows(out)  # one per sample of the group
        calls = rollout.per_call_rows(out)
        texts = [c.text for c in out.outputs]
        rewards = [float(task.summarize([problem], [t])["correct"]) for t in texts]
        mean = statistics.fmean(rewards)
        distinct = len({tuple(row["response_ids"]) for row in rows})
        print(f"problem {g}: {problem.prompt!r}  mean reward {mean:.2f}, "
              f"{distinct} distinct samples of {len(rows)}")
        for i, (row, reward) in enumerate(zip(rows, rewards)):
            sampled = sum(row["response_mask"])
            nodes = sorted(set(row["node_ids"]))
            mine = [r for r in calls if r["completion_index"] == i]
            # (ThreadWeaver's merge re-tokenizes text: its children's tokens
            # have their loss in their own per-call rows, not in this row.)
            print(f"  reward {reward:.0f} advantage {reward - mean:+.2f}: "
                  f"{len(row['response_ids'])} response tokens, {sampled} with loss in "
                  f"the row (nodes {nodes}); {len(mine)} per-call rows")
            if shown < args.show:
                shown += 1
                for r in mine:
                    print(f"    node {r['node_id'] or 'root'!s:>4} last={r['is_last']!s:5} "
                          f"context {len(r['context_ids'])} tokens -> "
                          f"{tok.decode(r['response_ids'])!r}")


if __name__ == "__main__":
    main()
