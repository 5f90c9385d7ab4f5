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

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from vllm_seqhooks.config.engine_defaults import ENGINE_KEY, checked_engine_defaults
from vllm_seqhooks.config.field_checks import unknown_fields_message
from vllm_seqhooks.config.special_kwargs import SpecialKwargs, SpecialKwargsError
from vllm_seqhooks.formats.tag_format import TAG_FIELDS, angle_bracket_problem

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
        raise SpecialKwargsError(_no_model_file(model))
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


#: Something like a Hugging Face hub id (``org/name``), not a local path.
_HUB_ID = re.compile(r"[\w][\w.-]*/[\w.-]+")


def _no_model_file(model: str | os.PathLike) -> str:
    """Why ``"auto"`` found no settings for ``model``, and what to do."""
    root = Path(model)
    fix = f"name a format instead ({', '.join(PRESETS)}) or give the settings"
    lead = (f"{AUTO!r} reads the hook settings stored with the model ({MODEL_FILE} "
            "beside config.json)")
    if root.is_dir():
        return f"{lead}, and the model directory {str(root)!r} has none: write one there, or {fix}"
    if root.exists():
        return f"{lead}, and {str(root)!r} is a file, not a model directory: {fix}"
    if _HUB_ID.fullmatch(str(model)):
        return (f"{AUTO!r} reads {MODEL_FILE} from a local model directory only, and "
                f"{str(model)!r} is none (it looks like a hub id): give the model's local "
                f"directory, or {fix}")
    return f"{lead}, but the model path {str(model)!r} does not exist: {fix}"


class ModelFileError(SpecialKwargsError):
    """A mistake in a model's ``seqhooks.json``: the message names the file,
    and the names in it are the file's field names (not ``vllm serve``
    flags)."""


class NearPresetTagError(SpecialKwargsError):
    """A tag that overrides a named format's with a near miss of it.
    ``settings``: the same settings without naming the format (what to give
    when the tag is meant); ``head``: the message up to its way out."""

    def __init__(self, head: str, exit_: str, settings: dict[str, Any]) -> None:
        super().__init__(f"{head}{exit_}")
        self.head = head
        self.settings = settings


#: Keys of seqhooks.json besides SpecialKwargs fields: ``format``, and the
#: ``engine`` section (engine defaults, which model_settings leaves out).
_FILE_KEYS = (FORMAT_KEY, ENGINE_KEY)


def _model_file(model: str | os.PathLike | None) -> "_FileSettings":
    """:func:`model_settings`, its keys checked (a typo names the file, the
    field meant and the file's fields), marked as read from the file."""
    data = model_settings(model)
    known = [*(f.name for f in dataclasses.fields(SpecialKwargs)), *_FILE_KEYS]
    unknown = [key for key in data if key not in known]
    path = Path(model) / MODEL_FILE
    if unknown:
        raise ModelFileError(unknown_fields_message(
            unknown, known, what=f"field(s) in {path}",
            known_as=f"the fields of {MODEL_FILE}"))
    return _FileSettings(data, path)


class _FileSettings(dict):
    """Settings read from a model's seqhooks.json (``path``)."""

    def __init__(self, data: Mapping[str, Any], path: Path) -> None:
        super().__init__(data)
        self.path = path


def _edits(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from ``a`` to ``b``."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            cost = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cost = min(cost, prev2[j - 2] + 1)
            row.append(cost)
        prev2, prev = prev, row
    return prev[-1]


def _check_near_tags(name: str, base: Mapping[str, Any], fields: Mapping[str, Any],
                     data: Mapping[str, Any]) -> None:
    """Refuse a tag of ``fields`` that is a near miss of the one it overrides
    in format ``name`` (``base``): one or two edits (one for tags of up to 7
    characters), other than whitespace around it. A model that never writes
    the tag never forks or never ends its children, without an error; a
    format that does use the near tag is given without naming ``name``."""
    for field in TAG_FIELDS:
        ours, theirs = fields.get(field), base.get(field)
        if not (isinstance(ours, str) and isinstance(theirs, str)) or ours.strip() == theirs.strip():
            continue
        if angle_bracket_problem(field, ours):
            continue  # refused by the tag format, which has no way out for it
        edits = _edits(ours, theirs)
        if edits > min(2, max(1, len(theirs) // 4)):
            continue
        where = f"the {name} format" if name != AUTO else "the model's settings"
        head = (f"{field} {ours!r} is {'one edit' if edits == 1 else 'two edits'} from "
                f"{where}'s {theirs!r}: did you mean {theirs!r}? (a tag the model does not "
                "write is plain text: nothing would fork, or no child would end at it)")
        settings = {**base, **fields}
        path = getattr(data, "path", None)
        if path is not None:
            raise ModelFileError(
                f"{path}: {head}. If the model does write {ours!r}, write the settings in "
                f"{path} without naming a format (then no tag is compared): "
                f"{json.dumps(settings)}")
        raise NearPresetTagError(
            head, f". If the model does write {ours!r}, give the settings without naming a "
            f"format (then no tag is compared): {json.dumps(settings)}", settings)


def expand(spec: str | Mapping[str, Any], model: str | os.PathLike | None = None) -> dict[str, Any]:
    """SpecialKwargs fields for a preset name, ``"auto"`` or a settings dict
    (a ``"format"`` in it names the preset its other fields override)."""
    if isinstance(spec, str):
        data: Mapping[str, Any] = _model_file(model) if spec == AUTO else {FORMAT_KEY: spec}
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
    base = _model_file(model) if name == AUTO else _preset(name)
    base = expand(base, model) if FORMAT_KEY in base else base
    # Ids given as overrides replace the preset's token strings for that hook.
    for hook in ("sync", "promise", "promise_end"):
        if f"{hook}_token_id" in fields:
            base.pop(f"{hook}_token", None)
    _check_near_tags(name, base, fields, data)
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
