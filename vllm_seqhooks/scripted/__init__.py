"""Hook tokens forced by a script, on a tiny random model built offline:
what ``python -m vllm_seqhooks --scripted`` and the install check
(``python -m vllm_seqhooks.check``) run, and what the tests build on.

- :mod:`.tiny_model`: the tiny random Llama model and its tokenizer (no vLLM
  import);
- :mod:`.protocol`: the ``SamplingParams.extra_args`` keys of a script and
  the plan of which token to force (no vLLM import);
- :mod:`.processor` / :mod:`.processor_v2`: the logits processors that force
  them, for vLLM's V1 model runner and Model Runner V2;
- :mod:`.params`: scripted ``SamplingParams`` and scripts written as text;
- :mod:`.runner_choice`: which runner (hence which processor) vLLM uses;
- :mod:`.llm`: a ``vllm_seqhooks.LLM`` on the tiny model with the processor
  installed.
"""
