"""Own outputs only, one writer per output, full and read-only disks as messages (confluence/outputs.py and every
command that writes a directory): nothing a user wrote is ever renamed, replaced or deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from confluence import outputs
from confluence.cli.main import app
from confluence.outputs import OutputError
from tests.fixtures.bookstore import HashEncoder, bookstore_files
from tests.fixtures.model import tiny_run_config

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes (and every folder), to compare before and after."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(root.rglob("*"))}


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command in a fresh process (its own exit code, stderr and signals)."""
    return subprocess.run([sys.executable, "-m", "confluence.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "JAX_PLATFORMS": "cpu"})


# --- own outputs only -------------------------------------------------------------------------------------------


def test_preprocess_into_a_project_folder_keeps_every_file(tmp_path):
    """The finding: `preprocess SRC -m p/metadata.json -o p` renamed and deleted a project folder holding a
    metadata.json (as if it were an old store). Now it is refused and every byte stays."""
    src, meta = bookstore_files(tmp_path / "src")
    project = tmp_path / "p"
    (project / "data").mkdir(parents=True)
    for f in src.iterdir():
        (project / "data" / f.name).write_bytes(f.read_bytes())
    (project / "metadata.json").write_bytes(Path(meta).read_bytes())
    (project / "notes.md").write_text("my notes")
    before = snapshot(project)
    r = cli("preprocess", str(project / "data"), "-m", str(project / "metadata.json"), "-o", str(project), "-q")
    assert r.returncode == 1, r.stderr
    assert "was not written by confluence; nothing was changed" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(project) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "src"]  # nothing beside it either


def test_a_store_is_replaced_only_by_a_store(tmp_path):
    from confluence.preprocess import preprocess
    from confluence.store import Store

    src, meta = bookstore_files(tmp_path)
    out = preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(), progress=False)
    assert outputs.output_kind(out) == "store"
    first = snapshot(out)
    preprocess(src, meta, out, encoder=HashEncoder(), progress=False)  # an earlier store: replaced, same bytes
    assert snapshot(out) == first
    Store.open(out)
    run = tmp_path / "run"
    outputs.mark(run, "run")
    with pytest.raises(OutputError, match="holds a training run, not a processed store"):
        preprocess(src, meta, run, encoder=HashEncoder(), progress=False)


def test_a_store_of_an_earlier_version_without_marker_is_still_replaced(tmp_path):
    from confluence.preprocess import preprocess

    src, meta = bookstore_files(tmp_path)
    out = preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(), progress=False)
    (out / outputs.MARKER_FILE).unlink()  # what earlier versions wrote: exactly the files metadata.json lists
    preprocess(src, meta, out, encoder=HashEncoder(), progress=False)
    assert outputs.output_kind(out) == "store"
    (out / outputs.MARKER_FILE).unlink()
    (out / "mine.txt").write_text("x")  # ... but not once a user's file sits in it
    with pytest.raises(OutputError, match="it holds '.confluence|it holds 'columns|it holds"):
        preprocess(src, meta, out, encoder=HashEncoder(), progress=False)
    assert (out / "mine.txt").read_text() == "x"


def test_demo_data_never_replaces_a_users_folder(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "flights.parquet").write_text("not really")
    (mine / "thesis.tex").write_text("keep")
    before = snapshot(mine)
    r = CliRunner().invoke(app, ["demo-data", "--out", str(mine)])
    assert r.exit_code == 1 and "was not written by confluence" in r.output
    assert snapshot(mine) == before
    out = tmp_path / "demo"
    assert CliRunner().invoke(app, ["demo-data", "--out", str(out)]).exit_code == 0
    first = snapshot(out)
    assert CliRunner().invoke(app, ["demo-data", "--out", str(out)]).exit_code == 0  # its own: replaced
    assert snapshot(out) == first and outputs.output_kind(out) == "raw-database"


def test_train_refuses_a_folder_of_other_files(tmp_path, tiny_store):
    from confluence.training.loop import open_stream, train

    cfg = tiny_run_config(sampler=STORE_SAMPLER, loop={"max_steps": 1})
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "data.csv").write_text("a,b\n1,2\n")
    stream = open_stream([tiny_store], cfg)
    try:
        with pytest.raises(OutputError, match="it holds 'data.csv'"):
            train(cfg, stream, folder, progress=False, force=True)
    finally:
        stream.close()
    assert sorted(p.name for p in folder.iterdir()) == ["data.csv"]


def test_output_files_are_not_replaced_without_force(tmp_path):
    mine = tmp_path / "metadata.json"
    mine.write_text('{"reviewed": true}')
    src, _ = bookstore_files(tmp_path / "src")
    r = CliRunner().invoke(app, ["draft-metadata", str(src), "-o", str(mine)])
    assert r.exit_code == 1 and "exists and was not written by confluence" in r.output
    assert mine.read_text() == '{"reviewed": true}'
    assert CliRunner().invoke(app, ["draft-metadata", str(src), "-o", str(mine), "--force"]).exit_code == 0
    assert "tables" in json.loads(mine.read_text())


def test_claim_file_accepts_its_own_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from confluence.evaluation.predict import write_table_atomic

    ours, theirs = tmp_path / "p.parquet", tmp_path / "q.parquet"
    write_table_atomic(pa.table({"x": [1]}), ours)
    pq.write_table(pa.table({"x": [1]}), theirs)
    outputs.claim_file(ours)
    with pytest.raises(OutputError, match="Pass --force"):
        outputs.claim_file(theirs)
    outputs.claim_file(theirs, force=True)
    with pytest.raises(OutputError, match="is a directory"):
        outputs.claim_file(tmp_path)


# --- temporaries of dead processes ------------------------------------------------------------------------------


def test_stale_temporaries_of_dead_processes_are_removed_at_the_next_start(tmp_path):
    from confluence.preprocess import preprocess

    src, meta = bookstore_files(tmp_path)
    pid = dead_pid()
    stale = tmp_path / f".tmp-store-{pid}"
    stale.mkdir()
    outputs.mark(stale, "store", pid=pid, host=os.uname().nodename)
    (stale / "big.npy").write_bytes(b"x" * 1000)
    legacy = tmp_path / f"store.tmp-{pid}"  # the pre-marker writer's name
    legacy.mkdir()
    stale_file = tmp_path / f".store.tmp-{pid}"
    stale_file.write_text("half")
    alive = tmp_path / f".tmp-store-{os.getppid()}"  # a live process's (this test's parent): left alone
    alive.mkdir()
    outputs.mark(alive, "store", pid=os.getppid(), host=os.uname().nodename)
    elsewhere = tmp_path / f".tmp-store-{pid}1"  # another host's (a shared file system): left alone
    elsewhere.mkdir()
    outputs.mark(elsewhere, "store", pid=int(f"{pid}1"), host="another-host")
    preprocess(src, meta, tmp_path / "store", encoder=HashEncoder(), progress=False)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert stale.name not in names and legacy.name not in names and stale_file.name not in names
    assert "store" in names and alive.name in names and elsewhere.name in names


def test_a_swap_interrupted_between_its_renames_puts_the_old_output_back(tmp_path):
    out = tmp_path / "store"
    old = tmp_path / f".tmp-store.old-{dead_pid()}"
    old.mkdir()
    outputs.mark(old, "store")
    (old / "metadata.json").write_text("{}")
    outputs.clean_stale(out)
    assert (out / "metadata.json").is_file() and not old.exists()


# --- one writer per output --------------------------------------------------------------------------------------


def test_a_second_writer_fails_at_once_naming_the_holder(tmp_path):
    out = tmp_path / "store"
    with outputs.locked(out):
        t0 = time.perf_counter()
        with pytest.raises(OutputError, match=rf"is being written by another process \(pid {os.getpid()} on host"):
            outputs.OutputLock(out).acquire()
        assert time.perf_counter() - t0 < 1
    outputs.OutputLock(out).acquire().release()  # released: free again
    assert not (tmp_path / ".store.lock").exists()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from confluence.outputs import OutputLock; "
        f"OutputLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(OutputError, match=f"pid {holder.pid}"):
        outputs.OutputLock(out).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = outputs.OutputLock(out).acquire()  # the kernel released the dead holder's lock
    assert json.loads((tmp_path / ".run.lock").read_text())["pid"] == os.getpid()
    lock.release()


@pytest.mark.slow
def test_two_train_processes_into_one_out_exactly_one_runs(tmp_path, tiny_store):
    cfg = tiny_run_config(sampler=STORE_SAMPLER, loop={"max_steps": 30, "ckpt_every": 10, "val_every": 30})
    conf = tmp_path / "tiny.json"
    conf.write_text(json.dumps(cfg.to_dict()))
    run = tmp_path / "run"
    args = ["train", "--db", str(tiny_store), "--config", str(conf), "--out", str(run), "--no-progress"]
    first = subprocess.Popen([sys.executable, "-m", "confluence.cli.main", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    deadline = time.time() + 120
    while not (tmp_path / ".run.lock").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    second = cli(*args, "--force")
    assert second.returncode == 1, second.stderr
    assert f"is being trained by another process (pid {first.pid}" in second.stderr
    assert "Traceback" not in second.stderr
    _out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_00000030"
    resumed = cli(*args, "--resume", "--set", "loop.max_steps=31")
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_00000031"


# --- resuming a damaged run -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_of_a_damaged_run_says_what_is_wrong(tmp_path, tiny_store):
    cfg = tiny_run_config(sampler=STORE_SAMPLER, loop={"max_steps": 4, "ckpt_every": 2, "val_every": 4})
    conf = tmp_path / "tiny.json"
    conf.write_text(json.dumps(cfg.to_dict()))
    run = tmp_path / "run"
    base = ["train", "--db", str(tiny_store), "--config", str(conf), "--out", str(run), "--no-progress"]
    assert CliRunner().invoke(app, base).exit_code == 0
    with open(run / "scalars.csv", "a") as f:  # a row cut short by a crash
        f.write("5,17000")
    r = CliRunner().invoke(app, [*base, "--resume", "--set", "loop.max_steps=5"])
    assert r.exit_code == 0, r.output
    rows = (run / "scalars.csv").read_text().splitlines()
    assert all(len(row.split(",")) == 4 for row in rows)
    ckpt = run / "checkpoints" / "step_00000005"
    meta = (ckpt / "meta.json").read_text()
    (ckpt / "meta.json").write_text('{"step": 5, "conf')  # damaged
    r = CliRunner().invoke(app, [*base, "--resume", "--set", "loop.max_steps=6"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "its meta.json is damaged or unreadable" in r.output
    assert "write its name (step_00000004) into" in r.output
    (ckpt / "meta.json").write_text(meta)
    (ckpt / "state.eqx").write_bytes((ckpt / "state.eqx").read_bytes()[:100])  # cut short
    r = CliRunner().invoke(app, [*base, "--resume", "--set", "loop.max_steps=6"])
    assert r.exit_code == 1 and "state.eqx cannot be read" in r.output


# --- full and read-only disks -----------------------------------------------------------------------------------


@pytest.fixture()
def small_disk(tmp_path):
    """A 3 MiB tmpfs (root only: else the tests that need it skip, saying why)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(mnt: Path, leave: int) -> None:
    """Fill the file system at `mnt` until `leave` bytes are free."""
    import shutil

    free = shutil.disk_usage(mnt).free
    (mnt / "filler").write_bytes(b"\0" * max(free - leave, 0))


def test_preprocess_on_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path, small_disk):
    src, meta = bookstore_files(tmp_path)
    _fill(small_disk, 64 * 1024)
    before = sorted(p.name for p in small_disk.iterdir())
    r = cli("preprocess", str(src), "-m", str(meta), "-o", str(small_disk / "store"), "-q")
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])  # not SIGBUS (-7 / 135)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no space left on the device" in lines[0] and str(small_disk / "store") in lines[0]
    assert "Traceback" not in r.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == before  # no temporary directory, no lock left


@pytest.mark.slow
def test_train_on_a_full_disk_is_one_error_line(tmp_path, small_disk, tiny_store):
    cfg = tiny_run_config(sampler=STORE_SAMPLER, loop={"max_steps": 2, "ckpt_every": 2, "val_every": 2})
    conf = tmp_path / "tiny.json"
    conf.write_text(json.dumps(cfg.to_dict()))
    _fill(small_disk, 8 * 1024)
    r = cli("train", "--db", str(tiny_store), "--config", str(conf), "--out", str(small_disk / "run"),
            "--no-progress")
    assert r.returncode == 1, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "no space left on the device" in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    leftovers = [p.name for p in (small_disk / "run").rglob(".tmp-*")] if (small_disk / "run").exists() else []
    assert leftovers == [] and not (small_disk / ".run.lock").exists()


def test_a_read_only_output_is_one_error_line(tmp_path):
    if os.geteuid() == 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)], capture_output=True)
        if r.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs")
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
    try:
        src, meta = bookstore_files(tmp_path)
        r = cli("preprocess", str(src), "-m", str(meta), "-o", str(ro / "store"), "-q")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and str(ro / "store") in lines[0]
        assert "read-only" in lines[0] or "permission denied" in lines[0]
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], check=False)


def test_a_memory_mapped_array_larger_than_the_free_space_is_an_error_not_sigbus(small_disk):
    """Without reserving its blocks first, filling a memory-mapped array on a full disk kills the process with
    SIGBUS (exit 135, no message): the space is now reserved when the array is created."""
    code = (
        "import numpy as np; from confluence.preprocess.writer import StoreWriter\n"
        f"w = StoreWriter({str(small_disk / 'store')!r})\n"
        "try:\n"
        "    a = w.array('big.npy', np.float32, (2_000_000,)); a[:] = 1.0; w.close('big.npy')\n"
        "except Exception as exc:\n"
        "    w.abort(); print(type(exc).__name__, exc); raise SystemExit(1)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).parents[1])
    assert r.returncode == 1, (r.returncode, r.stderr[-1000:])
    assert r.stdout.startswith("OutputError") and "its array big.npy" in r.stdout
    assert "no space left on the device" in r.stdout
    assert sorted(p.name for p in small_disk.iterdir()) == []
