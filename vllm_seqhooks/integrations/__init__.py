"""Integrations with the frameworks that train fork/join models.

- :mod:`.verl`: an agent loop for verl whose branching happens in the engine,
  and the engine arguments verl's vLLM server needs for it.

Each integration imports its framework only where it subclasses one of its
classes; the rest imports without it.
"""
