"""How hooks are written and found in sampled tokens (pure: no vLLM, no
torch): the scanners' events, the promise protocol's scanner, tag formats and
their scanner, tags found on token bytes, a tokenizer's bytes and text.
Imports ``core`` (what a request may do) and nothing else of this package."""
