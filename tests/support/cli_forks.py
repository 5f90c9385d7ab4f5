"""Several ``vllm ...`` command lines that end without serving (a refused
flag, ``--help``), run as the ``vllm`` console script runs them, for the
price of one vLLM import.

:func:`run_vllm_commands` starts one Python process that imports vLLM's
CLI and the modules its ``main()`` imports (nearly all of a refused
``vllm serve``'s seconds), then forks once per command line; each child sets
``sys.argv`` and does what the console script does, ``sys.exit(main())``,
with its stdout and stderr in files of its own. An exception escaping
``main()`` is printed as the interpreter prints it (``Traceback ...``,
exit status 1). vLLM's plugins load in each child, where ``main()`` loads
them, as in a fresh ``vllm`` process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: The modules ``vllm.entrypoints.cli.main.main()`` imports (best effort: a
#: name a release lacks is left to ``main()``).
_PRELOADED = ("vllm.entrypoints.cli.main", "vllm.entrypoints.cli.serve",
              "vllm.entrypoints.cli.openai", "vllm.entrypoints.cli.run_batch",
              "vllm.entrypoints.cli.benchmark.main", "vllm.entrypoints.cli.collect_env",
              "vllm.entrypoints.openai.api_server")


@dataclass(frozen=True)
class CommandResult:
    """What a ``vllm`` command line did: its exit status and its output."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_vllm_commands(vllm: str, commands: list[list[str]],
                      timeout: float = 300) -> list[CommandResult]:
    """Each of ``commands`` (arguments after ``vllm``) as ``vllm`` runs it;
    ``vllm`` is the console script's path (``argv[0]``)."""
    with tempfile.TemporaryDirectory(prefix="vllm-cli-") as tmp:
        files = [(str(Path(tmp) / f"{i}.out"), str(Path(tmp) / f"{i}.err"))
                 for i in range(len(commands))]
        spec = [[[vllm, *args], out, err] for args, (out, err) in zip(commands, files)]
        driver = subprocess.run([sys.executable, "-m", __name__, json.dumps(spec)],
                                capture_output=True, text=True, timeout=timeout)
        if driver.returncode != 0:
            raise RuntimeError(f"the vllm command driver failed:\n{driver.stderr[-3000:]}")
        codes = json.loads(driver.stdout.strip().splitlines()[-1])
        return [CommandResult(tuple(args), code, Path(out).read_text(), Path(err).read_text())
                for args, code, (out, err) in zip(commands, codes, files)]


def _run_in_child(argv: list[str], out: str, err: str) -> None:
    """In a forked child: the console script's ``sys.exit(main())``."""
    import traceback

    from vllm.entrypoints.cli.main import main

    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.argv = argv
    code = 0
    try:
        sys.exit(main())
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 (printed as the interpreter prints it)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _drive(spec: list[list]) -> list[int]:
    import importlib

    for name in _PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    codes = []
    for argv, out, err in spec:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_in_child(argv, out, err)
        _, status = os.waitpid(pid, 0)
        codes.append(os.waitstatus_to_exitcode(status))
    return codes


if __name__ == "__main__":
    print(json.dumps(_drive(json.loads(sys.argv[1]))))
