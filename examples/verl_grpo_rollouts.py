"""GRPO rollouts of the embedded ThreadWeaver-format model through verl's
agent-loop machinery, the branching done in the engine (docs/rl.md, "verl").

    python examples/verl_grpo_rollouts.py                  # 4 problems x 4 samples
    python examples/verl_grpo_rollouts.py --problems 8 --group 8

verl 0.9.1's own classes run in this process, without Ray
(``vllm_seqhooks.integrations.verl.local``): its ``vLLMHttpServer`` starts
the engine from verl's trainer config, the hook settings under
``actor_rollout_ref.rollout.engine_kwargs.vllm``; its ``AgentLoopWorker``
runs the ``seqhooks_agent`` loop (registered through
``agent_loop_config_path``) on each sample, through its ``LLMServerClient``,
and returns its ``DataProto``. The rewards come from the task's checker,
the advantages from verl's own ``compute_grpo_outcome_advantage``; the
script prints the batch's fields and, per sample, its reward, advantage,
the tokens the policy sampled (mask 1) and the engine inserted (mask 0),
and the per-call rows (``expanded_*``) ThreadWeaver's trainer takes. Needs
verl beside vLLM (docs/rl.md, "verl"); from the checkout's venv, where
``scripts/setup.sh`` puts it in ``.verl`` (outside the venv):
``PYTHONPATH=.verl .venv/bin/python examples/verl_grpo_rollouts.py``.
Sampling is at temperature 1 without a seed: runs differ.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--group", type=int, default=4, help="samples per problem (GRPO's n)")
    ap.add_argument("--seed", type=int, default=0, help="picks the problems")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the model needs far less
    asyncio.run(rollouts(args))


async def rollouts(args: argparse.Namespace) -> None:
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from vllm_seqhooks.integrations.verl import local
    from vllm_seqhooks.tasks import threadweaver as task

    problems = task.heldout_problems(args.problems, seed=task.HELDOUT_SEED + args.seed)
    cfg = local.trainer_config(str(task.model_dir()), "auto", rollout_n=args.group,
                               temperature=1.0, response_length=128)
    server = await local.start_server(cfg)
    try:
        worker = local.agent_loop_worker(cfg, local.server_client(cfg, server))
        batch = await worker.generate_sequences(
            local.prompts_batch([task.prompt_text(p.digits) for p in problems], repeat=args.group))
    finally:
        await local.stop_server(server)

    tok = worker.tokenizer
    tensors, extra = batch.batch, batch.non_tensor_batch
    mask = tensors["response_mask"]
    ids = local.responses(batch)
    lengths = [len(r) for r in ids]
    texts = [tok.decode(r, skip_special_tokens=True) for r in ids]
    index = extra["index"]
    rewards = [float(task.check(problems[int(index[i])].digits, t)) for i, t in enumerate(texts)]
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32)
    for i, n in enumerate(lengths):
        token_rewards[i, max(n - 1, 0)] = rewards[i]  # the outcome on the last token
    advantages, _ = compute_grpo_outcome_advantage(token_rewards, mask, index)

    print(f"verl DataProto: {len(batch)} rows")
    for key in sorted(tensors.keys()):
        print(f"  batch[{key!r}]: {tuple(tensors[key].shape)} {tensors[key].dtype}")
    print("  non_tensor_batch:", ", ".join(sorted(extra)))
    for p, problem in enumerate(problems):
        rows = [i for i in range(len(batch)) if int(index[i]) == p]
        mean = statistics.mean(rewards[i] for i in rows)
        print(f"\nproblem {p}: {task.prompt_text(problem.digits)!r}  mean reward {mean:.2f}")
        for i in rows:
            sampled = int(mask[i].sum())
            calls = len(extra["expanded_prompt_ids"][i])
            adv = float(advantages[i, 0]) if lengths[i] else 0.0
            print(f"  sample {i}: reward {rewards[i]:.0f}  advantage {adv:+.2f}  "
                  f"{lengths[i]} tokens ({sampled} sampled, {lengths[i] - sampled} inserted)  "
                  f"{calls} call row(s)  answer {task.extract_answer(texts[i])!r}")


if __name__ == "__main__":
    main()
