"""The vllm.general_plugins entry point: flags on vLLM's parsers, turned into
the engine configuration; nothing happens without hook flags."""

from __future__ import annotations

import importlib.metadata

import pytest


def serve_parser():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    parser.add_argument("model_tag", nargs="?")
    return AsyncEngineArgs.add_cli_args(parser)


def test_entry_point_is_registered():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.value == "vllm_seqhooks.plugin:register" for ep in eps)


def test_register_is_idempotent():
    from vllm.engine.arg_utils import EngineArgs

    from vllm_seqhooks.plugin import register
    from vllm_seqhooks.engine.serve_flags import add_hook_arguments

    register()
    first = EngineArgs.add_cli_args
    register()
    register()
    assert EngineArgs.add_cli_args is first
    parser = serve_parser()
    add_hook_arguments(parser)  # a second time on the same parser: no clash
    assert parser._option_string_actions["--sync-token-id"] is not None


def test_no_hook_flag_changes_nothing(tiny_model_dir):
    ns = serve_parser().parse_args([tiny_model_dir, "--max-model-len", "512"])
    assert ns.scheduler_cls is None
    assert not (ns.additional_config or {}).get("seqhooks")


def test_flags_become_the_python_configuration(tiny_model_dir):
    from vllm_seqhooks import SpecialKwargs
    from vllm_seqhooks.engine import SCHEDULER_CLASS_PATH

    ns = serve_parser().parse_args([
        tiny_model_dir, "--sync-token", "<sync>", "--promise-token-id", "4",
        "--promise-end-token", "</promise>", "--child-context", "payload",
        "--child-prompt-template", "Task: {payload}\n", "--max-child-depth", "2",
        "--child-max-tokens", "64", "--merge-separator", " | ", "--batch-order", "arrival",
        "--additional-config", '{"other": 1}',
    ])
    assert ns.scheduler_cls == SCHEDULER_CLASS_PATH
    assert ns.worker_extension_cls == "vllm_seqhooks.engine.worker.SeqHooksWorkerExtension"
    assert ns.additional_config["other"] == 1
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert (got.sync_token_id, got.promise_token_id, got.promise_end_token_id) == (6, 4, 5)
    assert got.child_context == "payload" and got.max_child_depth == 2
    assert got.child_max_tokens == 64 and got.merge_separator == " | "
    assert got.batch_order == "arrival"
    assert got.is_resolved and got.child_prompt_prefix_token_ids
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = AsyncEngineArgs.from_cli_args(ns)
    assert args.scheduler_cls == SCHEDULER_CLASS_PATH
    assert args.additional_config["seqhooks"] == got.to_dict()


def test_conflicting_scheduler_is_an_error(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args([tiny_model_dir, "--sync-token-id", "6",
                                   "--promise-token-id", "4", "--scheduler-cls",
                                   "vllm.v1.core.sched.scheduler.Scheduler"])
    assert exc.value.code == 2
    assert "--scheduler-cls" in capsys.readouterr().err


def test_kv_transfer_config_with_hooks_is_an_error(tiny_model_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args([
            tiny_model_dir, "--sync-token-id", "6", "--promise-token-id", "4",
            "--kv-transfer-config", '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}',
        ])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--kv-transfer-config" in err and "parked at <sync>" in err


def test_hook_flags_round_trip(tiny_model_dir):
    """The flags hook_flags() writes parse back to the same settings."""
    from vllm_seqhooks import SpecialKwargs
    from vllm_seqhooks.tasks import forkjoin as task
    from vllm_seqhooks.engine.serve_flags import hook_flags

    settings = task.hook_settings()
    ns = serve_parser().parse_args([tiny_model_dir, *hook_flags(settings)])
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert {k: getattr(got, k) for k in settings} == settings


def test_limit_flags_become_the_configuration(tiny_model_dir):
    from vllm_seqhooks import SpecialKwargs
    from vllm_seqhooks.engine.serve_flags import hook_flags

    settings = {"family_token_factor": 4, "max_descendants": 30,
                "max_live_children_per_family": 8, "max_live_children": 100,
                "child_timeout_s": 2.5, "family_timeout_s": 60.0, "fair_share": False}
    ns = serve_parser().parse_args([tiny_model_dir, "--sync-token-id", "6",
                                    "--promise-token-id", "4", *hook_flags(settings)])
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert {k: getattr(got, k) for k in settings} == settings
    ns = serve_parser().parse_args([tiny_model_dir, "--sync-token-id", "6",
                                    "--promise-token-id", "4", "--fair-share", "on"])
    assert SpecialKwargs.from_additional_config(ns.additional_config).fair_share is True


@pytest.mark.parametrize("flags,message", [
    (["--child-timeout", "nan"], "argument --child-timeout: expected a finite number"),
    (["--family-timeout", "-3"], "argument --family-timeout: expected a finite number"),
    (["--fair-share", "maybe"], "argument --fair-share: expected on or off"),
    (["--max-live-children", "0"], "argument --max-live-children: expected an integer >= 1"),
    (["--family-token-factor", "x"], "argument --family-token-factor: expected an integer"),
])
def test_bad_limit_flags_exit_with_a_clear_message(tiny_model_dir, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args([tiny_model_dir, "--sync-token-id", "6",
                                   "--promise-token-id", "4", *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["threadweaver", "multiverse", "npr", "parallel-r1"])
def test_seqhooks_format_flag_and_tag_overrides(tiny_model_dir, name, capsys):
    """``vllm serve MODEL --seqhooks NAME``: the preset; the tag flags
    override its fields."""
    from vllm_seqhooks import SpecialKwargs
    from vllm_seqhooks.config.presets import expand

    ns = serve_parser().parse_args([tiny_model_dir, "--seqhooks", name])
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert got.tag_format == SpecialKwargs(**expand(name)).tag_format
    assert ns.scheduler_cls == "vllm_seqhooks.engine.scheduler.SeqHooksScheduler"
    overrides = ["--merge-suffix", "\n", "--fork-min-tokens", "7", "--child-eos-text", "</X>"]
    if got.join == "splice":
        # A path may not get engine-added text under a splice join: refused,
        # naming the way out.
        with pytest.raises(SystemExit):
            serve_parser().parse_args([tiny_model_dir, "--seqhooks", name, *overrides])
        assert "--join='reprefill'" in capsys.readouterr().err
        overrides += ["--join", "reprefill"]
    ns = serve_parser().parse_args([tiny_model_dir, "--seqhooks", name, *overrides])
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert (got.merge_suffix, got.fork_min_tokens, got.child_eos_text) == ("\n", 7, "</X>")


def test_tag_format_flags_alone(tiny_model_dir):
    from vllm_seqhooks import SpecialKwargs

    ns = serve_parser().parse_args([tiny_model_dir, "--fork-tag", "<P>", "--fork-count", "3",
                                    "--child-header", "<Q{n}>", "--child-end-tag", "</Q>"])
    fmt = SpecialKwargs.from_additional_config(ns.additional_config).tag_format
    assert (fmt.fork_tag, fmt.fork_count, fmt.header("2"), fmt.eos_text) == (
        "<P>", 3, "<Q2>", "</Q>")


@pytest.mark.parametrize("flags,message", [
    (["--seqhooks", "threadweaver", "--sync-token", "<sync>"],
     "--fork-tag (a tag format, joined when the children end) and --sync-token cannot be combined"),
    (["--fork-tag", "<P>"], "exactly one of --outline-tag"),
    (["--fork-tag", "<P>", "--fork-count", "0"], "argument --fork-count: expected an integer >= 1"),
    (["--seqhooks", "threadweaver", "--fork-tag", "</Résumé>"], "cannot be written with this model"),
])
def test_bad_tag_format_flags_exit_with_a_clear_message(tiny_model_dir, capsys, flags, message):
    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args([tiny_model_dir, *flags])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_cli_error_keeps_the_users_token_text(tiny_model_dir, capsys):
    """Field names become flag names in CLI errors, but not inside the
    user's own values (``join`` is a field; ``'<join>'`` is the user's)."""

    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args([tiny_model_dir, "--sync-token", "<join>",
                                   "--promise-token-id", "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--sync-token '<join>' is not a single token" in err
    assert "<--join>" not in err


def test_help_shows_defaults_as_typed():
    """``vllm serve --help``: on/off for --fair-share, the newline of
    --merge-separator as bash writes it, '' for empty text; and those
    shown defaults never become settings."""
    parser = serve_parser()
    shown = {a.option_strings[0]: a.default for a in parser._actions if a.option_strings}
    assert shown["--fair-share"] == "on"
    assert shown["--merge-separator"] == "$'\\n'"
    assert shown["--merge-suffix"] == "''"
    assert shown["--max-child-depth"] == 1
    ns = parser.parse_args(["m"])  # (no hook flag: nothing is configured from them)
    assert getattr(ns, "scheduler_cls", None) is None


def test_the_models_engine_defaults_fill_what_the_user_left_unset(tmp_path):
    """``--seqhooks auto`` on a model whose seqhooks.json carries engine
    defaults: memory, block size and length come from it where no flag was
    given; a flag given wins, and a memory choice of any kind (also
    ``--gpu-memory-utilization``) keeps the model's KV cache size out. A typo
    in the file's ``"engine"`` is refused, naming the file."""
    import json

    from vllm_seqhooks.tasks import forkjoin as task

    model = str(task.model_dir())
    ns = serve_parser().parse_args([model, "--seqhooks", "auto"])
    assert (ns.kv_cache_memory_bytes, ns.block_size, ns.max_model_len) == (128 << 20, 32, 256)
    ns = serve_parser().parse_args([model, "--seqhooks", "auto", "--block-size", "64",
                                    "--max-model-len", "128"])
    assert (ns.kv_cache_memory_bytes, ns.block_size, ns.max_model_len) == (128 << 20, 64, 128)
    ns = serve_parser().parse_args([model, "--seqhooks", "auto", "--gpu-memory-utilization", "0.5"])
    assert ns.kv_cache_memory_bytes is None and ns.block_size == 32
    ns = serve_parser().parse_args([model, "--seqhooks", "auto", "--kv-cache-memory-bytes", "1G"])
    assert ns.kv_cache_memory_bytes == 1 << 30
    # a model without engine defaults: vLLM's own (and, on CPU, half the free
    # memory as KV cache when vLLM's default would be refused: cpu_memory.py)
    copy = tmp_path / "model"
    copy.mkdir()
    for f in task.model_dir().iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "seqhooks.json").write_text(json.dumps(task.MODEL_SETTINGS))
    ns = serve_parser().parse_args([str(copy), "--seqhooks", "auto"])
    assert (ns.block_size, ns.max_model_len) == (None, None)
    assert ns.kv_cache_memory_bytes != 128 << 20
    (copy / "seqhooks.json").write_text(json.dumps(
        {**task.MODEL_SETTINGS, "engine": {"block_sise": 32}}))
    with pytest.raises(SystemExit):
        serve_parser().parse_args([str(copy), "--seqhooks", "auto"])


def _embedded(name: str) -> str:
    from vllm_seqhooks.tasks import forkjoin, threadweaver

    return str({"forkjoin": forkjoin, "threadweaver": threadweaver}[name].model_dir())


def _serve_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        serve_parser().parse_args(args)
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("model, says", [
    ("/nonexistent", "but the model path '/nonexistent' does not exist: name a format instead "
                     "(promise, threadweaver, multiverse, npr, parallel-r1) or give the settings"),
    ("Qwen/Qwen3-8B", "'auto' reads seqhooks.json from a local model directory only, and "
                      "'Qwen/Qwen3-8B' is none (it looks like a hub id)"),
])
def test_seqhooks_auto_without_a_local_model_says_why(capsys, model, says):
    """``vllm serve /nonexistent --seqhooks auto``: what is wrong with the
    path, and what to give instead."""
    assert says in _serve_error(capsys, [model, "--seqhooks", "auto"])


def test_a_typo_in_seqhooks_json_names_its_fields_not_flags(tmp_path, capsys):
    """Through ``vllm serve`` a model file's mistakes keep the file's field
    names (flags name what the command line gives)."""
    (tmp_path / "seqhooks.json").write_text('{"format": "threadweaver", "fork_min_token": 8}')
    err = _serve_error(capsys, [str(tmp_path), "--seqhooks", "auto"])
    assert f"unknown field(s) in {tmp_path / 'seqhooks.json'}: 'fork_min_token' " \
           "(did you mean 'fork_min_tokens'?); the fields of seqhooks.json: batch_order," in err
    assert "--" not in err.split("the fields of seqhooks.json:")[1]


@pytest.mark.parametrize("flags, says", [
    (["--child-header", "<Thread>\n{m}:"],
     "--child-header '<Thread>\\n{m}:' holds '{m}', which is not a placeholder: the only one is "
     "{n} (the child's label: its outline number); did you mean '<Thread>\\n{n}:'?"),
    (["--fork-tag", "</Outlines"],
     "--fork-tag '</Outlines' opens '<' without closing it with '>'; did you mean '</Outlines>'?"),
    (["--fork-tag", "</Thread>"], "--fork-tag and --child-end-tag are both '</Thread>'; they must differ"),
])
def test_tag_mistakes_on_the_command_line_name_the_fix(capsys, flags, says):
    err = _serve_error(capsys, [_embedded("threadweaver"), "--seqhooks", "threadweaver", *flags])
    assert says in err


def test_a_near_miss_tag_flag_says_did_you_mean_and_gives_the_flags_to_keep_it(capsys):
    """``--seqhooks threadweaver --outline-tag '<Outlne>'``: refused naming
    the tag meant; the flags it offers to keep the value (bash words) give
    the same configuration."""
    import subprocess

    from vllm_seqhooks import SpecialKwargs
    from vllm_seqhooks.config.presets import expand

    model = _embedded("threadweaver")
    err = _serve_error(capsys, [model, "--seqhooks", "threadweaver", "--outline-tag", "<Outlne>"])
    assert err.split("error: ", 1)[1].startswith("--outline-tag '<Outlne>' is one edit from the threadweaver "
                          "format's '<Outline>': did you mean '<Outline>'?")
    assert "drop --seqhooks threadweaver and give the format's settings as flags" in err
    words = subprocess.run(["bash", "-c", "printf '%s\\0' " + err.split("compared): ")[1]],
                           capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    ns = serve_parser().parse_args([model, *words])
    got = SpecialKwargs.from_additional_config(ns.additional_config)
    assert got.tag_format == SpecialKwargs(
        **expand({"format": "threadweaver"}) | {"outline_tag": "<Outlne>"}).tag_format
