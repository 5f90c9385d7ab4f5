"""Every fenced shell and Python block of README.md and docs/ is tested as
pasted, or listed here as not runnable with the reason (issue 49, item 8).

The blocks are read from the pages (so they cannot drift): every fenced block
whose language is bash, sh, shell, console or python, and a bare ``` block
that holds a command (``vllm serve``, ``python``, ``curl``, ...). ``REGISTRY``
maps each block -- its file and a distinctive piece of its text, robust to
edits of the prose around it -- to exactly one way of handling it;
``test_every_block_is_registered_once`` fails on a block no entry or two
entries match, and on an entry no block matches, saying what to do. The ways:

- ``Run``: as pasted, from the checkout's root with the venv first on
  ``PATH`` (``bash -c`` for shell, a temporary .py file for Python): exit
  status 0, nothing crash-like in the output, what the block's comments
  promise.
- ``Serve``: ``vllm serve <embedded model> ...`` started as pasted on a free
  port of 127.0.0.1 (the one change: the port, in the serve line and in the
  block's ``curl``), then asked: the block's ``curl`` or Python client line,
  held-out problems answered right, and ``/v1/chat/completions`` with the
  bare problem as the one user message giving the completion's text. Blocks
  serving the same command share one server.
- ``Flags``: a ``vllm serve MODEL ...`` line whose MODEL is a placeholder,
  with an embedded model in its place, parsed in this process by ``vllm
  serve``'s own parser (with the plugin's hook flags): a flag that does not
  exist or a bad value fails; each hook flag given lands in the hook
  configuration, and what ``--seqhooks NAME`` names fills the rest. A
  ``--help`` line is run as pasted.
- ``Kwargs``: ``LLM(model, special_kwargs=...)`` with a placeholder model:
  the value through ``coerce_special_kwargs`` and resolved against an
  embedded model's tokenizer, as ``vllm_seqhooks.LLM`` does before it starts
  an engine.
- ``Options``: a script's command that is not run here (the reason says
  why): its options are parsed by the script's own ``argparse`` parser (run
  up to ``parse_args``, which then ends it), so a documented option that does
  not exist, or a bad value, fails.
- ``Overrides``: verl command-line overrides: the ``$(...)`` in them run as
  pasted, the files and names they give exist.
- ``CI``: a command CI itself runs: the link is checked (``.ci/run`` runs
  it, ``scripts/test.sh`` calls it), the command is not run again.
- ``NotHere``: not runnable here, with the reason, naming what covers it
  instead; the named file must hold the named text.

``Mixed`` splits a block by command when its lines need different ways. The
ways live in :mod:`tests.support.doc_commands` (``blocks``: reading the
pages; ``jobs``: running, ``Run``, ``CI``, ``NotHere``, ``All``, ``Mixed``;
``serving``: ``Serve``; ``parsing``: ``Flags``, ``Kwargs``, ``Options``,
``Overrides``); this file holds the registry and the tests.

Budgets (issue 49, item 1: each documented command at or under 3 GiB peak,
healthy within 60 s here): every command that starts an engine has the RSS
of its whole process tree sampled every 0.2 s
(``tests.support.resource_watch``), and the peak must be at most 3 GiB. Its
time -- to ``/health`` for a server, to exit for a command -- is measured and
printed (``-s`` shows it) and asserted only against a generous ceiling, three
times the documented or implied time (180 s for "healthy within 60 s"): this
project keeps timed assertions out of tests except where an issue demands
them, and the suite must pass on a busy machine.

Time (issue 51: over 60 s, and why): five documented commands start an
engine here (the ThreadWeaver demo, the two ``LLM`` snippets, the two
``vllm serve``; the README's demo runs from the installed wheel, in
tests/test_wheel.py), each as three processes importing torch and vLLM (the command's, vLLM's
EngineCore and its worker: about 30 CPU-seconds a command here), and no two
are the same command, so none can share another's run: on two cores that is
about two minutes however it is arranged. The jobs that wait on a
subprocess (``Job.ahead``: those five, ``--help``, the ``Options`` parses)
start at the module's first test, two at a time (``AHEAD``,
:mod:`tests.support.run_ahead`), the others' tests running meanwhile; so a
command's measured time includes another one running beside it (the
ceilings above allow for it; ``SEQHOOKS_DOCS_AHEAD=1`` measures each
alone), and its peak RSS is its own process tree's as before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.doc_commands.blocks import FORKJOIN, THREADWEAVER, read_blocks
from tests.support.doc_commands.jobs import CI, All, Handler, Job, Mixed, NotHere, Run
from tests.support.doc_commands.parsing import Flags, Kwargs, Options, Overrides
from tests.support.doc_commands.serving import Serve
from tests.support.run_ahead import RunAhead


# ------------------------------------------------------ what blocks promise


def _readme_curl_answer(answer: dict) -> None:
    text = answer["choices"][0]["text"]
    assert "<sync>" in text and text.endswith("=0123456789"), text
    assert len(answer["kv_transfer_params"]["seqhooks"]["children"]) == 3


def _child_budget(limit: int):
    def check(trace: dict) -> None:
        assert trace["children"], trace
        assert all(c["num_output_tokens"] <= limit for c in trace["children"]), trace
    return check


def _readme_python(stdout: str) -> None:
    # the model wrote its promises, the engine merged the children after <sync>
    assert "<sync>" in stdout and "join of ['0', '1', '2']" in stdout, stdout[-3000:]
    assert "=0123456789" in stdout  # sort 9081726354, answered


def _threadweaver_python(stdout: str) -> None:
    # The model forks at </Outlines>, the engine merges its four threads, the
    # conclusion is the answer. (Not the whole text token for token: its
    # fourth thread sorts 5761 as 1677, one of the model's 0.5 % of errors,
    # and its conclusion is right all the same.)
    digits = "0125073179975761"
    assert "</Outlines>\n<Thread>\n1:" in stdout and "<Thread>\n4:" in stdout, stdout[-3000:]
    assert f"<Conclusion>\n{''.join(sorted(digits))}</Conclusion>" in stdout, stdout[-3000:]


_DEMO = Run(expect=("5/5 correct",))
_BENCH_REASON = (
    "measurement runs of minutes (1 to 26) on both cores, those with --out docs/benchmarks "
    "rewriting the published pages; CI runs every workload at its smallest size "
    "(--smoke, tests/test_benchmarks_smoke.py) and checks where each writes "
    "(tests/test_script_outputs.py)")

#: vLLM 0.32's and 0.33's own scheduler tests: scripts/test.sh runs both parts.
_CONFORMANCE = {
    r"^PYTHON=\.venv033/bin/python bash scripts/upstream_conformance\.sh": All((
        CI("scripts/test.sh", "bash scripts/test_vllm033.sh"),
        CI("scripts/test_vllm033.sh", 'PYTHON="$PY" bash scripts/upstream_conformance.sh'))),
    r"^bash scripts/upstream_conformance\.sh": CI(
        "scripts/test.sh", 'PYTHON="$PY" bash scripts/upstream_conformance.sh'),
}

#: (file, a piece of the block's text) -> how it is tested.
REGISTRY: dict[tuple[str, str], Handler] = {
    # ---------------------------------------------------------------- README
    ("README.md", "./scripts/setup.sh && .venv/bin/python -m vllm_seqhooks"): Mixed({
        # (the demo: run from the installed wheel, its output and budget
        # checked there; from the checkout it differs only in where the
        # package is imported from)
        r"^\./scripts/setup\.sh && ": All((
            CI(".ci/run", "bash scripts/setup.sh", executable="scripts/setup.sh"),
            CI("tests/test_wheel.py", '[str(fresh_python), "-m", "vllm_seqhooks"]'))),
        r"^\./scripts/test\.sh": CI(".ci/run", "bash scripts/test.sh", executable="scripts/test.sh"),
    }),
    ("README.md", 'LLM("vllm_seqhooks/data/forkjoin_model", special_kwargs="auto"'):
        Run(check=_readme_python),
    ("README.md", 'LLM("path/to/your/model"'): Kwargs(),
    ("README.md", "vllm serve MODEL --seqhooks auto      #"): Flags(by_id=True),
    ("README.md", "curl -s 127.0.0.1:8000/v1/completions"): Serve(check=_readme_curl_answer),
    # ------------------------------------------------------------ docs/*.md
    ("docs/testing.md", "./scripts/test.sh        # the whole suite"):
        CI(".ci/run", "bash scripts/test.sh", executable="scripts/test.sh"),
    ("docs/install.md", "./scripts/setup.sh          #"):
        CI(".ci/run", "bash scripts/setup.sh", executable="scripts/setup.sh"),
    ("docs/install.md", "pip install vllm==0.32.0"): NotHere(
        "GPU installs (vLLM's CUDA wheel from PyPI) into the user's environment; the install "
        "check it ends with runs on CPU from the wheel in tests/test_wheel.py",
        covered=(("tests/test_wheel.py", '"-m", "vllm_seqhooks.check"'),)),
    ("docs/conformance.md", "bash scripts/upstream_conformance.sh                              #"):
        Mixed(_CONFORMANCE),
    ("docs/conformance.md", "bash scripts/upstream_conformance.sh\nPYTHON"): Mixed(_CONFORMANCE),
    ("docs/deployment.md", "ray start --head --port 6379"): Mixed({
        "^ray start ": NotHere(
            "several machines (a Ray cluster over nodes); tests/test_ray.py runs a local "
            "multi-node Ray cluster with the same flags",
            covered=(("tests/test_ray.py", "--distributed-executor-backend"),)),
        "vllm serve MODEL": Flags(),
    }),
    ("docs/deployment.md", "--data-parallel-rpc-port 13345 --api-server-count 1"): Flags(),
    ("docs/deployment.md", "torchrun --nproc-per-node 2 -m tests.support.spmd_rank"): NotHere(
        "two ranks, each with an engine, for a test's output directory (OUT_DIR): "
        "tests/test_spmd.py runs this command",
        covered=(("tests/test_spmd.py", '"tests.support.spmd_rank"'),)),
    ("docs/deployment.md", "--data-parallel-backend ray --data-parallel-size-local 1"): Flags(),
    ("docs/rl.md", "# a sketch: model, prompt, params, openai_client and MODEL are yours"): NotHere(
        "a sketch whose names are the reader's; examples/rl_rollout.py runs it whole "
        "(tests/test_readme_snippets.py::test_rl_rollout_example_runs_reproducibly), "
        "tests/test_rollout.py its rows",
        covered=(("examples/rl_rollout.py", "rollout.training_rows(out)"),
                 ("examples/rl_rollout.py", "rollout.per_call_rows(out)"),
                 ("tests/test_readme_snippets.py", "def test_rl_rollout_example_runs_reproducibly"))),
    ("docs/rl.md", "pip install --no-deps -r requirements/verl.txt"): NotHere(
        "installs into the environment; scripts/setup.sh installs the same requirements "
        "file with --no-deps (CI: .ci/run)",
        covered=(("scripts/setup.sh", "-r requirements/verl.txt"),)),
    ("docs/rl.md", "print(v.AGENT_LOOPS_AS_SINGLE_TURN)"): Overrides(),
    ("docs/rl.md", "default_agent_loop=seqhooks_agent"): Overrides(),
    ("docs/rl.md", "from omegaconf import OmegaConf"): Run(
        engine=False, expect=("scheduler_cls: vllm_seqhooks.engine.scheduler.SeqHooksScheduler",
                              "worker_extension_cls:", "additional_config:")),
    ("docs/serving.md", "vllm serve MODEL --seqhooks auto    #"): Flags(),
    ("docs/serving.md", "client.completions.create(model=..., prompt=..."): Serve(
        server=f"vllm serve {FORKJOIN} --seqhooks auto --dtype float32 --enforce-eager",
        check=_child_budget(64)),
    ("docs/threadweaver_model.md", "python -m vllm_seqhooks --model "
                                   "vllm_seqhooks/data/threadweaver_model   # the demo: five"):
        Mixed({"^python -m vllm_seqhooks ": _DEMO, "^vllm serve ": Serve()}),
    ("docs/threadweaver_model.md", 'LLM("vllm_seqhooks/data/threadweaver_model"'):
        Run(check=_threadweaver_python),
    ("docs/threadweaver_model.md",
     "--steps 1500 \\\n    --out vllm_seqhooks/data/threadweaver_model\n"):
        Options("a 40-minute training run that overwrites the embedded model"),
    ("docs/threadweaver_model.md", "scripts/eval_threadweaver.py --out docs"): Mixed({
        r"scripts/train_tiny_forkjoin\.py ": Options("a 40-minute training run that overwrites the "
                                          "embedded model"),
        r"scripts/eval_threadweaver\.py ": Options("a 10-minute evaluation that rewrites "
                                        "docs/threadweaver_eval.json and its page"),
        r"-m vllm_seqhooks --model ": _DEMO,
        r"-m pytest tests/test_threadweaver_model\.py": CI("scripts/test.sh", "-m pytest tests "),
    }),
    # ------------------------------------------------------ docs/benchmarks
    ("docs/benchmarks/README.md", ".venv/bin/python -m benchmarks --quick    #"): Mixed({
        r"-m benchmarks\.report ": NotHere(
            "rewrites the published tables and chart; tests/test_script_outputs.py re-renders "
            "results-quick.json into the cache with this module",
            covered=(("tests/test_script_outputs.py", "benchmarks.report"),)),
        r"-m benchmarks(?!\.report )": Options(_BENCH_REASON),
    }),
    ("docs/benchmarks/serve_load.md", "benchmarks.serve_load --requests 200"):
        Options(_BENCH_REASON),
    ("docs/benchmarks/gpu_timed_model.md", "python -m benchmarks.gpu_timed --smoke"): Mixed({
        r"--smoke": CI("tests/test_gpu_timed_grid.py", '"-m", "benchmarks.gpu_timed", "--smoke"'),
        r"-m benchmarks\.gpu_timed(?!.*--smoke)": Options(
            "the GPU-timed grid: two servers per profile and minutes of modelled GPU steps on "
            "both cores; CI runs its smoke (tests/test_gpu_timed_grid.py)"),
    }),
    ("docs/benchmarks/gpu_timed_model.md", "benchmarks.gpu_timed.plain_pairs --profile"): Options(
        "fresh pairs of GPU-timed servers, one after another: 6-12 minutes of both cores a "
        "profile"),
    ("docs/benchmarks/gpu_timed.md", "python -m benchmarks.gpu_timed --write-docs"): Options(
        "the GPU-timed grid that wrote the page: 28 minutes of both cores; CI runs its smoke "
        "(tests/test_gpu_timed_grid.py)"),
    # --------------------------------------------------------- docs/formats
    ("docs/formats/README.md", "--seqhooks npr --fork-min-tokens 64"): Flags(),
    ("docs/formats/README.md", 'LLM(model, special_kwargs="threadweaver")'): Kwargs(),
    ("docs/formats/multiverse.md", "vllm serve MODEL --seqhooks multiverse"): Flags(),
    ("docs/formats/npr.md", "vllm serve MODEL --seqhooks npr"): Flags(),
    ("docs/formats/parallel-r1.md", "vllm serve MODEL --seqhooks parallel-r1"): Flags(),
    ("docs/formats/promise.md", "vllm serve MODEL --seqhooks promise"):
        Mixed({"^vllm serve MODEL ": Flags(), f"^vllm serve {FORKJOIN} ": Serve()}),
    ("docs/formats/splice.md", '"join": "splice"'): Kwargs(),
    ("docs/formats/splice.md", "--seqhooks multiverse --join splice"): Flags(),
    ("docs/formats/threadweaver.md", "vllm serve MODEL --seqhooks threadweaver\n"):
        Mixed({"^vllm serve MODEL ": Flags(), f"^vllm serve {THREADWEAVER} ": Serve()}),
    ("docs/formats/threadweaver.md", "scripts/threadweaver_sft_by_hand.py"): Options(
        "needs ThreadWeaver's own source (--simple-eval PATH/...), and rewrites a page's "
        "data; tests/test_formats_oracle.py checks the same texts against ThreadWeaver's "
        "functions"),
}


# ---------------------------------------------------------------- collection


def collect() -> tuple[list[Job], list[str]]:
    """The jobs of every block, equal ones merged; and the registry's
    problems (unregistered, doubly registered, stale entries)."""
    problems: list[str] = []
    jobs: dict[tuple[str, str], Job] = {}
    used: set[tuple[str, str]] = set()
    for block in read_blocks():
        keys = [key for key in REGISTRY if key[0] == block.path and key[1] in block.text]
        used.update(keys)
        if len(keys) != 1:
            first = next((c for c in block.commands()), block.text)[:70]
            problems.append(
                f"{block.where} ({block.lang} block starting {first!r}) is matched by "
                f"{len(keys)} registry entries{': ' + str(keys) if keys else ''}: add exactly one "
                f"entry to REGISTRY in tests/test_docs_commands.py, keyed by "
                f"({block.path!r}, <a piece of text only this block of the page holds>), saying "
                "how it runs (Run, Serve, Flags, Kwargs, Options, Overrides, CI, or NotHere "
                "with the reason)")
            continue
        try:
            new = REGISTRY[keys[0]].jobs(block, block.commands())
        except AssertionError as exc:
            problems.append(f"{block.where}: {exc}")
            continue
        for job in new:
            merged = jobs.setdefault((job.kind, job.key), job)
            merged.sources.append(block.where)
            if merged is not job:
                merged.asks += job.asks
    problems += [f"REGISTRY entry {key} matches no block (stale: remove or update it)"
                 for key in REGISTRY if key not in used]
    return list(jobs.values()), problems


JOBS, PROBLEMS = collect()


def test_every_block_is_registered_once():
    assert not PROBLEMS, "\n".join(PROBLEMS)
    assert len(read_blocks()) >= 30  # (the extraction did find the pages' blocks)


def _params(slow: bool):
    return [pytest.param(job, id=job.id, marks=[pytest.mark.slow] if slow else [])
            for job in JOBS if job.slow == slow]


#: How many jobs marked ``ahead`` run at once (``SEQHOOKS_DOCS_AHEAD=1``:
#: one at a time, each command's time measured alone).
AHEAD = int(os.environ.get("SEQHOOKS_DOCS_AHEAD", "2"))


@pytest.fixture(scope="module", autouse=True)
def ahead(request, tmp_path_factory):
    """The selected jobs marked ``ahead`` (each waits on a subprocess),
    started at the module's first test, :data:`AHEAD` at a time, the servers
    first and then the other commands starting an engine (the longest); each
    test takes its own job's result."""
    selected = [item.callspec.params["job"] for item in request.session.items
                if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
                and "job" in item.callspec.params]
    runs = RunAhead(AHEAD)
    order = sorted((j for j in selected if j.ahead), key=lambda j: (j.kind != "serve", not j.slow))
    for job in order:
        tmp = tmp_path_factory.mktemp("ahead")
        runs.submit(_ahead_key(job), lambda job=job, tmp=tmp: job.run(job, tmp))
    yield runs
    runs.close()


def _ahead_key(job: Job) -> str:
    return f"{job.kind}: {job.key}"


def _run(job: Job, tmp_path: Path, ahead: RunAhead) -> None:
    if _ahead_key(job) in ahead:
        ahead.result(_ahead_key(job))
    else:
        job.run(job, tmp_path)


@pytest.mark.parametrize("job", _params(False))
def test_block(job: Job, tmp_path, ahead):
    """Commands that start no engine (the sources: ``job.sources``)."""
    _run(job, tmp_path, ahead)


@pytest.mark.parametrize("job", _params(True))
def test_block_starting_an_engine(job: Job, tmp_path, ahead):
    """Commands that start an engine, with the budgets of issue 49."""
    _run(job, tmp_path, ahead)
