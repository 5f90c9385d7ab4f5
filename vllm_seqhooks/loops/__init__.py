"""Client-side fork/join loops over a stock ``vllm.LLM``: the baselines the
engine is benchmarked against and the oracles it is tested against (the
promise protocol's loop, each tag format's loop). They use the pure packages,
never the engine."""
