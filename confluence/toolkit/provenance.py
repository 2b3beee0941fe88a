"""What code and machine a run is: recorded in every checkpoint of both models so that a run can be traced.

A run's `config.json` says what it was asked to do, not which code did it nor where; two runs of one configuration
can differ because the package's files differed (an uncommitted edit when the run started) or because the machine
or its libraries did (runs are bit-exact on one machine and library set, not across them: docs/design/decisions.md).
`code_provenance` reads, once per run, the package version, the git commit of the checkout it is imported from,
whether the package's files differ from that commit and a digest of the difference, and the environment: Python,
JAX, jaxlib, NumPy and numba versions, the backend's device kind and the CPU's model. Where the package is
installed rather than checked out, or git is missing, the git fields come from a stamp written where git could
tell (`write_stamp`, named by the `CONFLUENCE_CODE_STAMP` environment variable: the GPU machine receives a copy of
the working tree without `.git`, scripts/gpu_stamp.sh), else they are null; reading them never fails a run.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import jax

import confluence

_GIT_TIMEOUT_S = 10.0
STAMP_ENV = "CONFLUENCE_CODE_STAMP"  # path of a stamp (`write_stamp`) for a copy of a checkout without `.git`


def _git(root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True,
                          timeout=_GIT_TIMEOUT_S).stdout


def _checkout(root: Path, package: str) -> dict[str, Any]:
    """Commit, dirty flag and digest of the package's difference from the commit, for the checkout at `root`."""
    top = Path(_git(root, "rev-parse", "--show-toplevel").decode().strip()).resolve()
    if top != root.resolve():
        return {}  # the package sits inside some other repository (e.g. a virtual environment in a checkout)
    commit = _git(root, "rev-parse", "HEAD").decode().strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=all", "--", package).decode()
    changed = [line for line in status.splitlines() if line.strip()]
    out: dict[str, Any] = {"commit": commit, "dirty": bool(changed), "diff_sha256": None}
    if changed:
        h = hashlib.sha256(_git(root, "diff", "HEAD", "--binary", "--", package))
        for line in sorted(changed):  # untracked files are not in the diff: their names and bytes are
            if line.startswith("?? "):
                path = line[3:]
                h.update(path.encode())
                f = root / path
                if f.is_file():
                    h.update(f.read_bytes())
        out["diff_sha256"] = h.hexdigest()
    return out


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu() -> str | None:
    """The CPU's model name (Linux), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def environment() -> dict[str, Any]:
    """Python and library versions, the JAX backend's device kind and the CPU: what else decides a run's bits."""
    try:
        device = jax.devices()[0].device_kind
    except RuntimeError:
        device = None
    return {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": _version("jaxlib"),
            "numpy": _version("numpy"), "numba": _version("numba"), "backend": jax.default_backend(),
            "device": device, "cpu": _cpu()}


def code_provenance(root: Path | None = None, package: str = "confluence") -> dict[str, Any]:
    """The running code: `version`, `commit` (null outside a git checkout), `dirty` (the package's files differ
    from the commit: tracked edits or untracked files under `package/`), `diff_sha256` (a digest of that
    difference, equal for equal working trees) and `environment` (`environment()`). `root`
    defaults to the checkout this package is imported from."""
    root = Path(confluence.__file__).resolve().parent.parent if root is None else Path(root)
    try:
        git = _checkout(root, package)
    except (OSError, subprocess.SubprocessError, UnicodeDecodeError):
        git = {}  # no git, not a checkout, or git too slow: the run goes on without these fields
    out = {"version": confluence.__version__, "commit": git.get("commit"), "dirty": git.get("dirty"),
           "diff_sha256": git.get("diff_sha256"), "environment": environment()}
    if not git and os.environ.get(STAMP_ENV):
        out |= _stamp(Path(os.environ[STAMP_ENV]))
    return out


def _stamp(path: Path) -> dict[str, Any]:
    """The git fields of a stamp, marked as such (`stamped_at`: when it was written; the tree may have changed
    since); nothing, with a warning naming the file, if the stamp cannot be read."""
    try:
        got = json.loads(path.read_text())
        return {"commit": got["commit"], "dirty": got["dirty"], "diff_sha256": got["diff_sha256"],
                "stamped_at": got["stamped_at"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"{STAMP_ENV}={path}: not a readable code stamp ({type(exc).__name__}: {exc}); the run "
                      "records no commit (write one with scripts/gpu_stamp.sh)", stacklevel=3)
        return {}


def write_stamp(path: Path, root: Path | None = None) -> dict[str, Any]:
    """Write the checkout's git fields (commit, dirty, diff_sha256) and the time to `path`, for runs of a copy of
    this tree on a machine without its `.git` (`CONFLUENCE_CODE_STAMP=path` there)."""
    code = code_provenance(root)
    stamp = {k: code[k] for k in ("commit", "dirty", "diff_sha256")} | {"stamped_at": time.time()}
    Path(path).write_text(json.dumps(stamp, indent=2) + "\n")
    return stamp
