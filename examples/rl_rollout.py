"""GRPO-style rollout groups from the embedded ThreadWeaver-format model,
and the training rows a trainer takes from them (docs/rl.md).

    python examples/rl_rollout.py                 # 2 problems x 8 samples
    python examples/rl_rollout.py --problems 4 --group 8 --show 2

Each problem is sampled ``--group`` times at temperature 1 (a GRPO group:
``--group`` requests of one prompt, as ``n`` > 1 gives one hook trace for
all completions). The model decides where to fork; the engine runs the
children and joins them. For every sample it prints the reward (the
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
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

    from vllm import SamplingParams

    from vllm_seqhooks import LLM, rollout
    from vllm_seqhooks.tasks import threadweaver as task

    llm = LLM(str(task.model_dir()), special_kwargs="auto", **task.ENGINE_KWARGS)
    tok = llm.get_tokenizer()
    problems = task.heldout_problems(args.problems, seed=task.HELDOUT_SEED + args.seed)
    prompts = [p.prompt for p in problems for _ in range(args.group)]
    params = SamplingParams(temperature=1.0, max_tokens=task.PARENT_MAX_TOKENS)
    outs = llm.generate(prompts, params, use_tqdm=False)

    shown = 0
    for g, problem in enumerate(problems):
        group = outs[g * args.group:(g + 1) * args.group]
        rewards = [float(task.summarize([problem], [o.outputs[0].text])["correct"])
                   for o in group]
        mean = statistics.fmean(rewards)
        distinct = len({tuple(o.outputs[0].token_ids) for o in group})
        print(f"problem {g}: {problem.prompt!r}  mean reward {mean:.2f}, "
              f"{distinct} distinct samples of {len(group)}")
        for out, reward in zip(group, rewards):
            (row,) = rollout.training_rows(out)
            sampled = sum(row["response_mask"])
            nodes = sorted(set(row["node_ids"]))
            calls = rollout.per_call_rows(out)
            # (ThreadWeaver's merge re-tokenizes text: its children's tokens
            # have their loss in their own per-call rows, not in this row.)
            print(f"  reward {reward:.0f} advantage {reward - mean:+.2f}: "
                  f"{len(row['response_ids'])} response tokens, {sampled} with loss in "
                  f"the row (nodes {nodes}); {len(calls)} per-call rows")
            if shown < args.show:
                shown += 1
                for r in calls:
                    print(f"    node {r['node_id'] or 'root'!s:>4} last={r['is_last']!s:5} "
                          f"context {len(r['context_ids'])} tokens -> "
                          f"{tok.decode(r['response_ids'])!r}")


if __name__ == "__main__":
    main()
