"""Hook settings by name, and settings carried by the model (pure, no vLLM).

``special_kwargs`` / ``vllm serve --seqhooks`` accept:

* a preset name: ``"promise"`` (``<promise>`` payload ``</promise>`` ...
  ``<sync>``, token strings resolved through the model's tokenizer), or a published model family's tag format: ``"threadweaver"``,
  ``"multiverse"``, ``"npr"``, ``"parallel-r1"`` (docs/formats/);
* ``"auto"``: the settings stored in the model directory, ``seqhooks.json``
  beside ``config.json`` (whose ``"engine"`` object, if any, holds engine
  defaults sized to the model: :mod:`vllm_seqhooks.config.engine_defaults`);
* a dict, which may name a preset under ``"format"`` and override any of its
  fields (a ``seqhooks.json`` has the same form).

:func:`expand` turns any of these into plain :class:`SpecialKwargs` fields;
:func:`coerce_special_kwargs` into a :class:`SpecialKwargs`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from vllm_seqhooks.config.engine_defaults import ENGINE_KEY, checked_engine_defaults
from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError

#: The file a model directory carries its hook settings in.
MODEL_FILE = "seqhooks.json"
#: The key of a settings dict that names a preset.
FORMAT_KEY = "format"
AUTO = "auto"

PRESETS: dict[str, dict[str, Any]] = {
    "promise": {
        "sync_token": "<sync>",
        "promise_token": "<promise>",
        "promise_end_token": "</promise>",
    },
    # docs/formats/<name>.md: where each comes from, what is exact.
    "threadweaver": {
        "fork_tag": "</Outlines>",
        "outline_tag": "<Outline>",
        "header_lead": "\n",
        "child_header": "<Thread>\n{n}:",
        "child_end_tag": "</Thread>",
        "child_eos_text": "\n</Thread>",
        "merge_separator": "",
        "merge_suffix": "\n<Conclusion>\n",
        "unclosed_child_stop_text": "\n<Conclusion>\n</Conclusion>\n</Parallel>",
        "boundary_tokenization": "text",
    },
    "multiverse": {
        "fork_tag": "</Goal>",
        "outline_tag": "<Outline>",
        "header_lead": "\n",
        "child_header": "<Path>\n{n}:",
        "child_end_tag": "</Path>",
        "child_eos_text": "",
        "merge_separator": "\n",
        "merge_suffix": "\n<Conclusion>\n",
        "max_child_depth": 5,
        "fork_min_tokens": 30,
        "boundary_tokenization": "ids",
        "join": "splice",
    },
    "npr": {
        "fork_tag": "</guideline>",
        "outline_tag": "<plan>",
        "header_lead": "\n",
        "child_header": "<step>\n{n}:",
        "child_end_tag": "</step>",
        "child_eos_text": "",
        "merge_separator": "\n",
        "merge_suffix": "\n<takeaway>\n",
        "max_child_depth": 5,
        "fork_min_tokens": 1024,
        "boundary_tokenization": "ids",
        "join": "splice",
    },
    "parallel-r1": {
        "fork_tag": "<Parallel>",
        "fork_count": 2,
        "child_header": "<Path>",
        "child_end_tag": "</Path>",
        "merge_separator": "",
        "merge_suffix": "</Parallel>\n<Summary>",
        "boundary_tokenization": "ids",
    },
}


def _preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise SpecialKwargsError(
            f"unknown hook format {name!r}; known: {', '.join([*PRESETS, AUTO])}"
        )
    return dict(PRESETS[name])


def model_settings(model: str | os.PathLike | None) -> dict[str, Any]:
    """The hook settings a model directory carries (its ``seqhooks.json``,
    without the engine defaults: :func:`model_engine_defaults`)."""
    if model is None:
        raise SpecialKwargsError(f"{AUTO!r} needs the model's directory")
    path = Path(model) / MODEL_FILE
    if not path.is_file():
        where = ("a local model directory" if not Path(model).is_dir()
                 else f"{path} is missing")
        raise SpecialKwargsError(
            f"{AUTO!r} reads the hook settings stored with the model in {MODEL_FILE}, "
            f"beside config.json; {where} (name a format instead, e.g. 'promise', "
            f"or give the settings)"
        )
    data = _read_model_file(path)
    data.pop(ENGINE_KEY, None)
    if data.get(FORMAT_KEY) == AUTO:
        raise SpecialKwargsError(f"{path}: {FORMAT_KEY!r} cannot be {AUTO!r}")
    return data


def model_engine_defaults(model: str | os.PathLike | None) -> dict[str, Any]:
    """The engine defaults a model directory carries (``"engine"`` in its
    ``seqhooks.json``; :mod:`vllm_seqhooks.config.engine_defaults`), checked;
    ``{}`` for a model without them (or not a local directory)."""
    path = Path(model) / MODEL_FILE if model is not None else None
    if path is None or not path.is_file():
        return {}
    data = _read_model_file(path)
    if ENGINE_KEY not in data:
        return {}
    return checked_engine_defaults(data[ENGINE_KEY], str(path))


def _read_model_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise SpecialKwargsError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecialKwargsError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def expand(spec: str | Mapping[str, Any], model: str | os.PathLike | None = None) -> dict[str, Any]:
    """SpecialKwargs fields for a preset name, ``"auto"`` or a settings dict
    (a ``"format"`` in it names the preset its other fields override)."""
    if isinstance(spec, str):
        data: Mapping[str, Any] = model_settings(model) if spec == AUTO else {FORMAT_KEY: spec}
    elif isinstance(spec, Mapping):
        data = spec
    else:
        raise SpecialKwargsError(
            f"special_kwargs must be a format name, 'auto', a dict or a SpecialKwargs, "
            f"got {type(spec).__name__}"
        )
    fields = dict(data)
    name = fields.pop(FORMAT_KEY, None)
    if name is None:
        return fields
    if not isinstance(name, str):
        raise SpecialKwargsError(f"{FORMAT_KEY} must be a format name, got {name!r}")
    base = model_settings(model) if name == AUTO else _preset(name)
    base = expand(base, model) if FORMAT_KEY in base else base
    # Ids given as overrides replace the preset's token strings for that hook.
    for hook in ("sync", "promise", "promise_end"):
        if f"{hook}_token_id" in fields:
            base.pop(f"{hook}_token", None)
    base.update(fields)
    return base


def coerce_special_kwargs(value: Any, model: Any = None) -> SpecialKwargs | None:
    """Accept ``None``, a :class:`SpecialKwargs`, a dict (which may name a
    format under ``"format"``), a format name such as ``"promise"``, or
    ``"auto"`` (the settings in ``model``'s directory)."""
    if value is None:
        return None
    if isinstance(value, SpecialKwargs):
        return value
    return SpecialKwargs.from_dict(expand(value, model))
