"""Own outputs only: what every command that writes a directory does before it writes, replaces or deletes one.

A directory a command writes carries a marker file (`MARKER_FILE`: the kind of output and the version that wrote
it). A command may write into a missing or empty directory, or replace / continue a directory that carries the
marker of its own kind; a non-empty directory without the marker is an error naming one of its files, so a user's
folder is never renamed, replaced or deleted. Temporary directories carry the marker too (with the writer's PID
and host), so those of dead processes are recognised and removed at the next start. One writer per output:
`OutputLock` is an advisory lock beside the output naming its holder; a second writer fails at once, and the
lock of a dead process is released by the kernel (flock) and taken over.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluence
from confluence.errors import ConfluenceError

MARKER_FILE = ".confluence-output.json"

# the kinds of output, in the words messages use
KINDS = {
    "store": "a processed store",
    "run": "a training run",
    "raw-database": "a raw database written by confluence",
    "corpus": "a pretraining corpus",
    "pretrained-model": "an exported pretrained model",
    "text-corpus": "a prepared text corpus",
    "text-run": "a text-model training run",
    "report": "an evaluation report",
    "benchmark": "a benchmark's output",
    "demo": "a demo's output",
    "synthetic-database": "a synthetic database",
}


class OutputError(ConfluenceError):
    """An output directory may not be written: it holds files confluence did not write, another kind of output,
    or another process is writing it."""


def marker(kind: str, **extra: Any) -> dict[str, Any]:
    """The marker's content for an output of `kind` (deterministic: no time, so stores stay byte-identical)."""
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}")
    return {"written_by": "confluence", "kind": kind, "version": confluence.__version__, **extra}


def mark(directory: str | Path, kind: str, **extra: Any) -> None:
    """Write `kind`'s marker into `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MARKER_FILE
    tmp = directory / f".{MARKER_FILE}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(marker(kind, **extra), sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_marker(directory: str | Path) -> dict[str, Any] | None:
    """The marker of `directory`, None when it has none (or an unreadable one)."""
    try:
        data = json.loads((Path(directory) / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != "confluence" or data.get("kind") not in KINDS:
        return None
    return data


def output_kind(directory: str | Path) -> str | None:
    """The kind of output `directory` holds according to its marker, or None."""
    data = read_marker(directory)
    return None if data is None else str(data["kind"])


def _first_entry(directory: Path) -> str:
    names = sorted(p.name for p in directory.iterdir())
    return names[0] if names else ""


def claim(out: str | Path, kind: str, *, legacy: Callable[[Path], bool] | None = None) -> str:
    """Check that a command producing `kind` may write `out`, and say what is there: "absent", "empty" or "ours"
    (an earlier output of this kind, which the caller may continue, or replace where the user asked to).

    `legacy(out)` recognises an output of this kind written before markers existed (it must accept only a
    directory holding nothing but such an output). Raises `OutputError` naming the problem: `out` is a file, it
    holds another kind of output, or it is a non-empty directory confluence did not write (naming one of its
    files); nothing is changed."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise OutputError(f"{out}: exists and is not a directory; nothing was changed. Choose another output path")
    if not out.exists():
        return "absent"
    try:
        entries = [p.name for p in out.iterdir()]
    except OSError as exc:
        raise OutputError(f"{out}: cannot be read ({exc.strerror or exc}); nothing was changed") from None
    if not entries:
        return "empty"
    found = output_kind(out)
    if found == kind or (found is None and legacy is not None and legacy(out)):
        return "ours"
    if found is not None:
        raise OutputError(f"{out}: holds {KINDS[found]}, not {KINDS[kind]}; nothing was changed. Choose another "
                          "output path")
    raise OutputError(f"{out}: is not empty (it holds {_first_entry(out)!r}) and was not written by confluence; "
                      "nothing was changed. Choose a new or empty directory (confluence never replaces a folder "
                      "it did not create)")


def remove_output(out: str | Path, kind: str, *, legacy: Callable[[Path], bool] | None = None) -> None:
    """Delete `out` if it is an output of `kind` (checked again here, right before deleting); else OutputError."""
    out = Path(out)
    if claim(out, kind, legacy=legacy) in ("ours", "empty"):
        shutil.rmtree(out)


def temp_dir(out: str | Path, kind: str) -> Path:
    """Create and return a fresh temporary directory beside `out` (`.tmp-<name>-<pid>`), marked as this process's,
    so that a later start can tell it from a user's folder and remove it if this process died."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(out)
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    if tmp.exists():  # this PID's own leftover (a reused PID after a crash): ours by name and marker
        if read_marker(tmp) is None:
            raise OutputError(f"{tmp}: exists and was not written by confluence; remove it or choose another path")
        shutil.rmtree(tmp)
    tmp.mkdir()
    mark(tmp, kind, pid=os.getpid(), host=socket.gethostname())
    return tmp


def replace_dir(tmp: Path, out: Path, kind: str, *, legacy: Callable[[Path], bool] | None = None) -> Path:
    """Move the finished temporary directory `tmp` to `out`, replacing an earlier output of `kind` there (never
    anything else: checked again here). The marker loses its PID and host. Returns `out`."""
    mark(tmp, kind)
    from confluence.fsutil import fsync_path

    state = claim(out, kind, legacy=legacy)
    old = out.parent / f".tmp-{out.name}.old-{os.getpid()}"
    if state == "ours":
        os.replace(out, old)
    elif state == "empty":
        out.rmdir()
    os.replace(tmp, out)
    fsync_path(out.parent)
    if old.exists():
        shutil.rmtree(old)
    return out


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _temp_patterns(name: str) -> list[re.Pattern[str]]:
    """The names of temporaries beside an output called `name`, each with the writer's PID as group 1."""
    n = re.escape(name)
    return [re.compile(rf"^\.tmp-{n}(?:\.old)?-(\d+)$"),    # temp_dir / replace_dir / fsutil.atomic_dir
            re.compile(rf"^{n}\.(?:tmp|old)-(\d+)(?:-\w+)?$"),  # the pre-marker writers' form
            re.compile(rf"^\.{n}\.tmp-(\d+)$")]                # fsutil.atomic_write_bytes, a file


def clean_stale(out: str | Path) -> list[Path]:
    """Remove the temporaries beside `out` left by dead processes of this host (`.tmp-<name>-<pid>`,
    `<name>.tmp-<pid>`, `.<name>.tmp-<pid>` of a PID no longer running; a directory whose marker names another
    host is left alone, as are live PIDs'). An earlier output moved aside by `replace_dir` of a process killed
    before it put the new one in place is moved back to `out`. Returns what was removed or moved back."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    removed = []
    host = socket.gethostname()
    patterns = _temp_patterns(out.name)
    for p in sorted(out.parent.iterdir()):
        m = next((m for pat in patterns if (m := pat.match(p.name))), None)
        if m is None:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        if p.is_dir() and not p.is_symlink():
            mk = read_marker(p)
            if mk is not None and mk.get("host", host) != host:
                continue
            if ".old-" in p.name and mk is not None and not out.exists():
                os.replace(p, out)  # killed between the two renames of a swap: the earlier output goes back
                removed.append(p)
                continue
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


class OutputLock:
    """One writer per output: an advisory lock (`flock`) on `<parent>/.<name>.lock`, holding the holder's PID,
    host, command and start time. `acquire` fails at once with `OutputError` naming the holder when another
    process holds it; a dead holder's lock is released by the kernel and simply taken. Use as a context manager;
    the lock file is removed on release."""

    def __init__(self, out: str | Path, what: str = "written", *, wait: bool = False):
        self.out = Path(out).absolute()
        self.path = self.out.parent / f".{self.out.name}.lock"
        self.what = what
        self.wait = wait  # block until the holder is done instead of failing at once
        self._fd: int | None = None

    def acquire(self) -> OutputLock:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputError(f"{self.out}: is being {self.what} by another process ({holder}); nothing was "
                                  "changed. Wait for it to finish, or choose another output path") from None
            except BaseException:
                os.close(fd)
                raise
            try:  # the file may have been removed by the holder we waited on: lock the one on disk
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        # the command's first words only: its arguments may hold a password (a postgresql:// URL)
        words = [Path(sys.argv[0]).name, *[a for a in sys.argv[1:3] if re.fullmatch(r"[a-z][a-z-]*", a)]] if sys.argv else []
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(words) or "python",
                "since": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        data = {}
    if not data:
        return "holder unknown"
    return (f"pid {data.get('pid')} on host {data.get('host')}, since {data.get('since')}: "
            f"{data.get('command', '?')}")


@contextlib.contextmanager
def locked(out: str | Path, what: str = "written", *, wait: bool = False) -> Iterator[OutputLock]:
    """`with locked(out): ...`: hold `out`'s `OutputLock` for the block (`wait`: until the holder is done)."""
    lock = OutputLock(out, what, wait=wait).acquire()
    try:
        yield lock
    finally:
        lock.release()


_REASONS = {28: "no space left on the device", 30: "the file system is read-only", 13: "permission denied",
            1: "operation not permitted", 122: "the disk quota is exceeded"}


def write_failure(exc: OSError, path: str | Path, what: str, after: str = "nothing partial was kept") -> OutputError:
    """One message for a write that failed: `path`, what was being written, and why (for a full disk, how much
    is free). The caller removes its temporaries and raises this instead of the OSError's traceback."""
    reason = _REASONS.get(exc.errno or 0) or exc.strerror or str(exc)
    if exc.errno is None and "requested and" in str(exc):  # numpy's short write: the disk filled up
        reason = f"a short write ({exc}): the disk is probably full"
    where = Path(path)
    try:
        probe = where if where.exists() else next(p for p in where.parents if p.exists())
        free = shutil.disk_usage(probe).free
        reason += f"; {free / 2**20:.1f} MiB free there" if exc.errno in (28, 122, None) else ""
    except (OSError, StopIteration):
        pass
    culprit = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(path) else ""
    return OutputError(f"{path}: cannot write {what}: {reason}{culprit}; {after}")


@contextlib.contextmanager
def writing(path: str | Path, what: str, after: str = "nothing partial was kept") -> Iterator[None]:
    """Turn an OSError raised while writing `what` at `path` into one `OutputError` line (`write_failure`)."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise write_failure(exc, path, what, after) from None


PARQUET_KEY = b"written_by"  # a Parquet file confluence wrote records b"confluence" under this schema key


HTML_GENERATOR = b'<meta name="generator" content="confluence">'  # in the head of every report page


def claim_file(path: str | Path, *, force: bool = False) -> None:
    """Check that a command may write the output file `path`: a new file, a Parquet file confluence wrote (its
    schema metadata says so), or any file with `force` (`--force`). Anything else is refused with an
    `OutputError`, before any work is done: an output never silently replaces a user's file."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path}: is a directory; the output is a file (name it, e.g. {path / 'out.parquet'})")
    if not path.exists() and not path.is_symlink() or force:
        return
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            if (pq.read_schema(path).metadata or {}).get(PARQUET_KEY) == b"confluence":
                return
        except Exception:  # noqa: BLE001 - not a readable Parquet file: not ours
            pass
    if path.suffix == ".html":  # a report page: its head names its writer
        try:
            with open(path, "rb") as f:
                if HTML_GENERATOR in f.read(4096):
                    return
        except OSError:
            pass
    raise OutputError(f"{path}: exists and was not written by confluence; nothing was changed. Pass --force to "
                      "replace it, or choose another file")
