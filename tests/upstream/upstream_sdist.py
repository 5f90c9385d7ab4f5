"""Fetch and unpack a vLLM release's source distribution (it ships upstream's
``tests/``) for the upstream conformance check (``run_conformance.py``): the
index pip is configured with, its CA bundle, the pinned sha256. No vLLM import."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from run_conformance import Release


def log(msg: str = "") -> None:
    print(f"[upstream-conformance] {msg}" if msg else "", flush=True)


class DownloadError(RuntimeError):
    pass



# --------------------------------------------------------------- download
def _pip_config(python: str) -> dict[str, str]:
    """``pip config list`` as {key: value} (keys like ``global.index-url``)."""
    try:
        out = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True,
            text=True, timeout=120, check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    cfg: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip()] = value.strip().strip("'\"")
    return cfg


def pip_default_index(python: str) -> str:
    """The index pip uses when none is configured, asked of pip itself."""
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=120, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise DownloadError(f"cannot ask pip for its default index: {exc}") from exc
    if not out:
        raise DownloadError("pip named no default index")
    return out


def index_urls(python: str) -> tuple[list[str], str | None]:
    """The package indexes pip would use (index-url first, then the extra
    ones), and its configured CA bundle."""
    cfg = _pip_config(python)

    def setting(name: str) -> str | None:
        env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
        if env:
            return env
        for scope in (":env:", "site", "user", "global", "install", "download"):
            if f"{scope}.{name}" in cfg:
                return cfg[f"{scope}.{name}"]
        return None

    urls = [setting("index-url") or pip_default_index(python)]
    urls += (setting("extra-index-url") or "").split()
    return [u for i, u in enumerate(urls) if u and u not in urls[:i]], setting("cert")


def _open(url: str, cafile: str | None, accept: str | None = None, timeout: float = 60):
    req = urllib.request.Request(url, headers={"User-Agent": "vllm-seqhooks-conformance"})
    if accept:
        req.add_header("Accept", accept)
    ctx = None
    if url.startswith("https:"):
        ctx = ssl.create_default_context(
            cafile=cafile if cafile and os.path.isfile(cafile) else None
        )
    return urllib.request.urlopen(req, timeout=timeout, context=ctx)


def find_sdist(index: str, cafile: str | None, name: str) -> tuple[str, str | None]:
    """(url, sha256 or None) of the sdist file ``name`` on one simple index."""
    page = index.rstrip("/") + "/vllm/"
    if page.startswith("file:"):
        path = urllib.request.url2pathname(urllib.parse.urlparse(page).path)
        if os.path.isdir(path):
            page = urllib.parse.urljoin(page, "index.html")
    accept = ("application/vnd.pypi.simple.v1+json, "
              "application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1")
    with _open(page, cafile, accept) as resp:
        ctype = resp.headers.get("Content-Type", "") or ""
        body = resp.read().decode("utf-8", "replace")
        base = resp.geturl()
    if "json" in ctype:
        for f in json.loads(body).get("files", []):
            if f.get("filename") == name:
                return urllib.parse.urljoin(base, f["url"]), f.get("hashes", {}).get("sha256")
    else:
        for href in re.findall(r"""<a\s[^>]*href\s*=\s*["']([^"']+)["']""", body, re.I):
            href = html.unescape(href)
            url = urllib.parse.urljoin(base, href)
            path, _, frag = url.partition("#")
            if urllib.parse.unquote(path.rsplit("/", 1)[-1]) == name:
                m = re.search(r"sha256=([0-9a-f]{64})", frag)
                return path, m.group(1) if m else None
    raise DownloadError(f"{page} does not list {name}")


def fetch_sdist(cache: Path, python: str, local: str | None, release: Release) -> Path:
    name, sha = release.sdist, release.sha256
    dest = cache / "sdist" / name
    if local:
        src = Path(local)
        if not src.is_file():
            raise DownloadError(f"--sdist {src}: no such file")
        if _sha256(src) != sha:
            raise DownloadError(f"--sdist {src}: sha256 is not that of {name}")
        return src
    if dest.is_file() and _sha256(dest) == sha:
        log(f"sdist: cached {dest}")
        return dest
    urls, cafile = index_urls(python)
    errors: list[str] = []
    for index in urls:
        try:
            url, listed_sha = find_sdist(index, cafile, release.sdist)
        except (DownloadError, urllib.error.URLError, OSError, ValueError) as e:
            errors.append(f"{index}: {e}")
            continue
        if listed_sha and listed_sha != sha:
            errors.append(f"{index}: lists {name} with sha256 {listed_sha}, "
                          f"expected {sha}")
            continue
        log(f"sdist: downloading {url}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(".part")
        t0 = time.time()
        try:
            h = hashlib.sha256()
            with _open(url, cafile, timeout=120) as resp, open(part, "wb") as out:
                while chunk := resp.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, OSError) as e:
            errors.append(f"{url}: {e}")
            part.unlink(missing_ok=True)
            continue
        if h.hexdigest() != sha:
            part.unlink(missing_ok=True)
            errors.append(f"{url}: sha256 {h.hexdigest()} != {sha}")
            continue
        os.replace(part, dest)
        log(f"sdist: {dest.stat().st_size / 1e6:.1f} MB in {time.time() - t0:.1f} s")
        return dest
    raise DownloadError("; ".join(errors) or "no package index configured")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def extract(sdist: Path, cache: Path, release: Release) -> Path:
    """Extract ``tests/`` and ``pyproject.toml`` (not the ``vllm`` package:
    the tests must import the installed vLLM) into the cache."""
    root = cache / "src"
    top = release.top
    dest = root / top
    marker = root / f".extracted-{release.sha256[:16]}"
    if marker.is_file() and (dest / "tests" / "v1").is_dir():
        return dest
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(dir=root))
    prefix = f"{top}/tests/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(prefix) or m.name == f"{top}/pyproject.toml"]
        tar.extractall(tmp, members=members, filter="data")
    os.replace(tmp / top, dest)
    tmp.rmdir()
    marker.write_text(release.sha256 + "\n")
    log(f"extracted {len(members)} files to {dest}")
    return dest
