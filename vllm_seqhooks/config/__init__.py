"""What a user sets (pure: no vLLM, no torch): :class:`SpecialKwargs` and the
checks of its fields, presets and the settings a model carries, and the
per-request keys. Imports nothing else of this package but ``formats`` (a
tag format's own checks)."""
