"""The ``vllm serve`` flags of sequence hooks.

:func:`add_hook_arguments` gives a vLLM argument parser a "Sequence hooks"
group (the plugin, :mod:`vllm_seqhooks.plugin`, does it for every parser
that takes engine arguments) and wraps its ``parse_known_args`` so that, when
a hook flag is given, the flags become the same configuration as the Python
path: ``--additional-config`` gains ``{"seqhooks": ...}`` and
``--scheduler-cls`` becomes the fork/join scheduler. Without hook flags
nothing changes. Bad values end the command with ``error: ...`` (exit code
2), as argparse does.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import re
import shlex
from typing import Any, Callable

from vllm_seqhooks.config import field_checks
from vllm_seqhooks.config.presets import (
    FORMAT_KEY,
    MODEL_FILE,
    PRESETS,
    ModelFileError,
    NearPresetTagError,
    expand,
)
from vllm_seqhooks.config.special_kwargs import (
    BATCH_ORDERS,
    CHILD_CONTEXTS,
    JOIN_MODES,
    MERGE_STRATEGIES,
    SpecialKwargs,
    SpecialKwargsError,
)
from vllm_seqhooks.engine.cpu_memory import cpu_memory_args
from vllm_seqhooks.engine.engine_args import hook_engine_args, load_tokenizer, model_engine_args
from vllm_seqhooks.engine.metrics_export import enable_metrics

logger = logging.getLogger("vllm.seqhooks.plugin")

GROUP_TITLE = "Sequence hooks (vllm-seqhooks)"
#: The engine arguments hooks set or refuse, and their flags.
ENGINE_ARGS = ("scheduler_cls", "worker_extension_cls", "additional_config", "kv_transfer_config")
CLI_NAMES = {"scheduler_cls": "--scheduler-cls", "kv_transfer_config": "--kv-transfer-config"}
DEST_PREFIX = "seqhooks_"


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        return field_checks.seconds()("value", float(text))
    except (ValueError, SpecialKwargsError):
        raise argparse.ArgumentTypeError(
            f"expected a finite number of seconds > 0, got {text!r}") from None


def _on_off(text: str) -> bool:
    value = text.strip().lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


class _Given(argparse.Action):
    """Stores the value and remembers that the flag was given (the defaults
    shown in --help are SpecialKwargs' own)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, GIVEN_ATTR, ()) or ())
        given.add(self.dest)
        setattr(namespace, GIVEN_ATTR, given)


GIVEN_ATTR = "_seqhooks_given"
#: Hook settings by format name or from the model (vllm_seqhooks.config.presets).
FORMAT_FLAG = "--seqhooks"

#: flag -> (SpecialKwargs field, argparse kwargs)
FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--sync-token-id": ("sync_token_id", {"type": _non_negative_int, "metavar": "ID",
                        "help": "Token id of <sync>: blocks a request until its open children finish."}),
    "--promise-token-id": ("promise_token_id", {"type": _non_negative_int, "metavar": "ID",
                           "help": "Token id of <promise>: opens a sub-task; its payload spawns a child request."}),
    "--promise-end-token-id": ("promise_end_token_id", {"type": _non_negative_int, "metavar": "ID",
                               "help": "Token id that closes a payload; unset: the next <promise>, <sync> or the end closes it."}),
    "--sync-token": ("sync_token", {"metavar": "TOKEN",
                     "help": "<sync> as a token string, resolved through the model's tokenizer."}),
    "--promise-token": ("promise_token", {"metavar": "TOKEN",
                        "help": "<promise> as a token string."}),
    "--promise-end-token": ("promise_end_token", {"metavar": "TOKEN",
                            "help": "The payload-closing token as a token string."}),
    "--child-context": ("child_context", {"choices": CHILD_CONTEXTS,
                        "help": "fork: a child's prompt is the parent's context up to the end of the payload; payload: the payload alone."}),
    "--child-prompt-template": ("child_prompt_template", {"metavar": "TEXT",
                                "help": "With --child-context payload: text around the payload, containing {payload} once."}),
    "--merge-strategy": ("merge_strategy", {"choices": MERGE_STRATEGIES,
                         "help": "concatenate: children's outputs are appended after <sync>; none: <sync> only waits."}),
    "--merge-separator": ("merge_separator", {"metavar": "TEXT",
                          "help": "Text between merged child outputs."}),
    "--max-child-depth": ("max_child_depth", {"type": _non_negative_int, "metavar": "N",
                          "help": "Nesting limit: a child at this depth does not spawn."}),
    "--max-children-per-request": ("max_children_per_request", {"type": _non_negative_int, "metavar": "N",
                                   "help": "Fan-out limit per request; further promises are plain text."}),
    "--child-max-tokens": ("child_max_tokens", {"type": _positive_int, "metavar": "N",
                           "help": "Token budget of each child; unset: the parent's remaining budget."}),
    "--batch-order": ("batch_order", {"choices": BATCH_ORDERS,
                      "help": "family: keep each request's children next to each other in the model's batch "
                              "(they share the parent's KV blocks; measured 2x faster CPU attention); "
                              "arrival: vLLM's order."}),
    "--join": ("join", {"choices": JOIN_MODES,
               "help": "How a tag format's parent joins: reprefill (it prefills the merged text) or "
                       "splice (it takes its children's KV, paths side by side at shared positions, "
                       "as Multiverse and NPR models are trained; docs/formats/splice.md)."}),
    "--failed-child-marker": ("failed_child_marker", {"metavar": "TEXT",
                              "help": "Text merged in place of a child that failed or was aborted; unset: nothing."}),
    "--family-token-factor": ("family_token_factor", {"type": _positive_int, "metavar": "N",
                              "help": "A request and all its descendants may sample N x its max_tokens tokens; "
                                      "unset: 1 + max_children_per_request. Past it, descendants are cut (length)."}),
    "--max-descendants": ("max_descendants", {"type": _non_negative_int, "metavar": "N",
                          "help": "Children a request may spawn at all levels together; further promises are plain text."}),
    "--max-live-children-per-family": ("max_live_children_per_family", {"type": _positive_int, "metavar": "N",
                                       "help": "Children of one request (all levels) alive at once; further promises are plain text, "
                                               "a tag format's fork children wait."}),
    "--max-live-children": ("max_live_children", {"type": _positive_int, "metavar": "N",
                            "help": "Children alive at once in the engine; further promises are plain text, "
                                    "a tag format's fork children wait."}),
    "--child-timeout": ("child_timeout_s", {"type": _seconds, "metavar": "SECONDS",
                        "help": "A child still running this long after its spawn fails (timeout); its parent resumes."}),
    "--family-timeout": ("family_timeout_s", {"type": _seconds, "metavar": "SECONDS",
                         "help": "This long after a request arrived its descendants are cut and it finishes with what it has."}),
    "--fair-share": ("fair_share", {"type": _on_off, "metavar": "on|off",
                     "help": "on: while other requests wait, one family's children get at most an equal share "
                             "of the running slots and KV blocks."}),
    # Tag formats (vllm_seqhooks.formats.tag_format; the presets set these).
    "--fork-tag": ("fork_tag", {"metavar": "TEXT",
                   "help": "A tag format: the parent forks when it writes this text (e.g. '</Outlines>') and "
                           "resumes when its children end; instead of the promise/sync tokens."}),
    "--outline-tag": ("outline_tag", {"metavar": "TEXT",
                      "help": "One child per '<outline-tag> N:' item written since the last fork."}),
    "--fork-count": ("fork_count", {"type": _positive_int, "metavar": "N",
                     "help": "Instead of outline items: N children at each fork."}),
    "--child-header": ("child_header", {"metavar": "TEXT",
                       "help": "Text that starts child {n} after the parent's context ({n}: its outline number)."}),
    "--header-lead": ("header_lead", {"metavar": "TEXT",
                      "help": "Text before every child's header in its prompt, once before the first in the merge."}),
    "--child-end-tag": ("child_end_tag", {"metavar": "TEXT",
                        "help": "A child stops after writing this text (kept)."}),
    "--child-eos-text": ("child_eos_text", {"metavar": "TEXT",
                         "help": "Appended to a child that ended otherwise (EOS, length); default: the end tag."}),
    "--merge-suffix": ("merge_suffix", {"metavar": "TEXT",
                       "help": "Appended after the children's outputs when the parent resumes."}),
    "--fork-min-tokens": ("fork_min_tokens", {"type": _positive_int, "metavar": "N",
                          "help": "A fork with fewer than N tokens left to sample spawns nothing."}),
    "--boundary-tokenization": ("boundary_tokenization", {"choices": ("text", "ids"),
                                "help": "text: the text the engine adds is tokenized with the text around it as one "
                                        "string (text-level orchestrators); ids: each piece is encoded alone and "
                                        "appended (id-level loops). A tag ends at its last byte either way."}),
    "--unclosed-child-stop-text": ("unclosed_child_stop_text", {"metavar": "TEXT",
                                   "help": "When a child ended without its end tag (EOS, out of tokens), the parent's "
                                           "merge ends with TEXT instead of the merge suffix and the parent finishes "
                                           "(length); unset: it goes on."}),
}


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SpecialKwargs)}


def shown_default(value: Any) -> Any:
    """A default as ``--help`` shows it: as the user would type it
    (``on``/``off``, ``''`` for empty text, bash's ``$'\\n'`` for text with
    control characters). Only shown: the settings read back are the flags
    given (:func:`hook_args_from_namespace`), never these defaults."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, str):
        if value == "":
            return "''"
        if not value.isprintable():
            escaped = value.encode("unicode_escape").decode("ascii").replace("'", "\\'")
            return f"$'{escaped}'"
    return value


def hook_flags(settings: dict[str, Any]) -> list[str]:
    """The ``vllm serve`` flags that give ``settings`` (SpecialKwargs
    fields -> values; None values are left out)."""
    by_field = {name: flag for flag, (name, _kw) in FLAGS.items()}
    by_field[FORMAT_KEY] = FORMAT_FLAG
    out: list[str] = []
    for name, value in settings.items():
        if name not in by_field:
            raise SpecialKwargsError(f"{name!r} has no vllm serve flag")
        if value is not None:
            out += [by_field[name], str(value)]
    return out


def add_hook_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the hook flags to ``parser`` (once) and hook its parsing."""
    if "--sync-token-id" in getattr(parser, "_option_string_actions", {}):
        return parser
    clashes = [f for f in FLAGS if f in getattr(parser, "_option_string_actions", {})]
    if clashes:  # pragma: no cover - would mean vLLM grew a flag of ours
        logger.error("vllm-seqhooks: flags %s already exist; not adding hook flags", clashes)
        return parser
    group = parser.add_argument_group(
        GROUP_TITLE,
        "Fork/join generation driven by the model's own special tokens or tags. "
        "--seqhooks NAME|auto, --sync-token-id/--sync-token with "
        "--promise-token-id/--promise-token, or --fork-tag turns hooks on; "
        "without hook flags the server is stock vLLM.",
    )
    group.add_argument(
        FORMAT_FLAG, dest=DEST_PREFIX + FORMAT_KEY, default=None, action=_Given,
        metavar="NAME|auto",
        help=f"Hook settings by format name ({', '.join(PRESETS)}), or 'auto': the "
             f"settings stored with the model ({MODEL_FILE} beside config.json). "
             "The other hook flags override them.")
    for flag, (name, kwargs) in FLAGS.items():
        group.add_argument(
            flag, dest=DEST_PREFIX + name, default=shown_default(_DEFAULTS[name]),
            action=_Given, **kwargs
        )
    original = parser.parse_known_args

    @functools.wraps(original)
    def parse_known_args(args=None, namespace=None):
        namespace, rest = original(args, namespace)
        try:
            apply_hook_args(namespace, parser.get_default)
        except SpecialKwargsError as exc:
            # (a model file's mistakes name its fields, not flags)
            parser.error(str(exc) if isinstance(exc, ModelFileError) else _as_flags(str(exc)))
        return namespace, rest

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    return parser


#: A quoted value in a message (Python's repr of a string; an apostrophe inside a
#: word, as in "model's", opens none): left as the user wrote it.
_QUOTED = re.compile(r"(?<!\w)'(?:[^'\\]|\\.)*'" + r'|(?<!\w)"(?:[^"\\]|\\.)*"')


def _as_flags(message: str) -> str:
    """Name command-line flags, not SpecialKwargs fields, in CLI errors
    (outside quoted values: ``--sync-token '<join>'`` stays ``'<join>'``)."""
    by_field = {name: flag for flag, (name, _kw) in FLAGS.items()}
    field = re.compile(r"(?<![\w-])(" + "|".join(
        sorted(map(re.escape, by_field), key=len, reverse=True)) + r")(?![\w-])")
    # (split keeps the quoted values, at the odd places)
    pieces = re.split(f"({_QUOTED.pattern})", message)
    return "".join(piece if i % 2 else field.sub(lambda m: by_field[m.group(1)], piece)
                   for i, piece in enumerate(pieces))


def _shell_word(value: Any) -> str:
    """``value`` as a shell word (bash's ``$'...'`` for control characters)."""
    text = str(value)
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + text.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"


def _near_tag_with_flags(exc: NearPresetTagError, given: dict[str, Any]) -> str:
    """A near-miss tag's error for ``vllm serve``: the way out as the flags
    that give the same settings without naming the format."""
    try:
        flags = hook_flags(exc.settings)
    except SpecialKwargsError:  # a setting without a flag: the settings as they are
        return str(exc)
    words = " ".join(flag if i % 2 == 0 else _shell_word(flag) for i, flag in enumerate(flags))
    return (f"{exc.head}. If the model does write it, drop {FORMAT_FLAG} {given[FORMAT_KEY]} "
            f"and give the format's settings as flags (then no tag is compared): {words}")


def hook_args_from_namespace(namespace: argparse.Namespace) -> dict[str, Any]:
    """The hook settings given on the command line (field -> value)."""
    given = getattr(namespace, GIVEN_ATTR, None) or ()
    return {
        name: getattr(namespace, DEST_PREFIX + name)
        for name in (FORMAT_KEY, *(name for name, _kw in FLAGS.values()))
        if DEST_PREFIX + name in given
    }


def apply_hook_args(namespace: argparse.Namespace,
                    default_of: Callable[[str], Any] = lambda name: None) -> SpecialKwargs | None:
    """Turn given hook flags into ``additional_config``/``scheduler_cls`` on
    ``namespace``, and set the engine defaults the model carries where the
    value is still the parser's default (``default_of(dest)``). Returns the
    configuration, or None when no flag was given."""
    given = hook_args_from_namespace(namespace)
    if not given:
        return None
    if getattr(namespace, "_seqhooks_applied", False):
        return SpecialKwargs.from_additional_config(namespace.additional_config)
    model = getattr(namespace, "model_tag", None) or getattr(namespace, "model", None)
    try:
        settings = expand(given, model)
    except NearPresetTagError as exc:
        raise SpecialKwargsError(_near_tag_with_flags(exc, given)) from None
    hooks = SpecialKwargs.from_dict(settings)
    engine_args = {name: getattr(namespace, name, None) for name in ENGINE_ARGS}
    hook_engine_args(hooks, engine_args, CLI_NAMES)  # refuse before loading a tokenizer
    try:
        tokenizer = load_tokenizer(
            model,
            tokenizer=getattr(namespace, "tokenizer", None),
            trust_remote_code=getattr(namespace, "trust_remote_code", False),
            tokenizer_revision=getattr(namespace, "tokenizer_revision", None),
            tokenizer_mode=getattr(namespace, "tokenizer_mode", None),
        )
    except Exception as exc:  # noqa: BLE001 - reported as a CLI error
        raise SpecialKwargsError(
            f"sequence hooks need the model's tokenizer, which could not be "
            f"loaded from {model!r}: {exc}"
        ) from exc
    hooks = hooks.resolve(tokenizer)

    def given(name: str) -> Any:
        value = getattr(namespace, name, None)
        return None if value == default_of(name) else value

    for name, value in model_engine_args(model, given).items():
        setattr(namespace, name, value)
    memory = {name: getattr(namespace, name, None)
              for name in ("kv_cache_memory_bytes", "gpu_memory_utilization")}
    for name, value in {**hook_engine_args(hooks, engine_args, CLI_NAMES),
                        **cpu_memory_args(memory)}.items():
        setattr(namespace, name, value)
    enable_metrics()
    namespace._seqhooks_applied = True
    logger.info("sequence hooks configured: %s", hooks.to_json())
    return hooks
