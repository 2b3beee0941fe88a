"""TensorBoard event files beside scalars.csv: the same scalars, one curve after a resume, and the real
`tensorboard` server serves a training run's curves over HTTP."""

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

from confluence.toolkit.logs import TENSORBOARD_DIR, ScalarLog, read_scalars
from tests.fixtures.net import free_port

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def events(run_dir):
    """tag -> [(step, value)] as TensorBoard reads the run's event files (its purge of restarted steps included)."""
    acc = event_accumulator.EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_events_hold_the_csv_scalars(tmp_path):
    log = ScalarLog(tmp_path / "scalars.csv")
    for step in range(1, 5):
        log.write(step, {"train/loss": 1.0 / step, "lr/adamw": 1e-3 * step})
    log.close()
    csv, tb = read_scalars(tmp_path / "scalars.csv"), events(tmp_path)
    assert set(tb) == set(csv) == {"train/loss", "lr/adamw"}
    for tag in csv:
        assert [s for s, _ in tb[tag]] == [s for s, _ in csv[tag]] == [1, 2, 3, 4]
        np.testing.assert_allclose([v for _, v in tb[tag]], [v for _, v in csv[tag]], rtol=1e-5)


def test_a_resume_in_the_same_second_keeps_one_curve_without_repeats(tmp_path):
    log = ScalarLog(tmp_path / "scalars.csv")
    for step in range(1, 7):
        log.write(step, {"train/loss": 1.0 / step})
    log.close()
    # resumed from the checkpoint of step 3: steps 4..6 are logged again with other values
    log = ScalarLog(tmp_path / "scalars.csv", truncate_after_step=3)
    for step in range(4, 7):
        log.write(step, {"train/loss": 2.0 / step})
    log.close()
    assert len(list((tmp_path / TENSORBOARD_DIR).iterdir())) == 2  # the first file was not overwritten
    got = events(tmp_path)["train/loss"]
    assert [s for s, _ in got] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([v for _, v in got], [1, 1 / 2, 1 / 3, 2 / 4, 2 / 5, 2 / 6], rtol=1e-6)
    assert got == [(s, pytest.approx(v, rel=1e-5)) for s, v in read_scalars(tmp_path / "scalars.csv")["train/loss"]]


def test_no_events_when_disabled_or_not_the_main_process(tmp_path):
    ScalarLog(None).write(1, {"x": 1.0})
    log = ScalarLog(tmp_path / "scalars.csv", tensorboard=False)
    log.write(1, {"x": 1.0})
    log.close()
    assert not (tmp_path / TENSORBOARD_DIR).exists()


def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.mark.slow
def test_tensorboard_serves_a_training_runs_curves(tiny_store, tmp_path):
    from confluence.training.loop import open_stream, train
    from tests.test_training_loop import _cfg

    cfg = _cfg(loop={"max_steps": 4, "ckpt_every": 4, "val_every": 2})
    run = tmp_path / "run"
    with open_stream([tiny_store], cfg) as s:
        train(cfg, s, run, progress=False)
    csv = read_scalars(run / "scalars.csv")
    exe = shutil.which("tensorboard") or str(__import__("pathlib").Path(sys.executable).with_name("tensorboard"))
    port = free_port()
    proc = subprocess.Popen([exe, "--logdir", str(run), "--port", str(port), "--host", "127.0.0.1",
                             "--load_fast", "false", "--reload_interval", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}/data/plugin/scalars"
        deadline, tags = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            try:
                tags = _get(f"{base}/tags")
                if tags.get(TENSORBOARD_DIR, {}).keys() >= csv.keys():
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.5)
        assert set(tags[TENSORBOARD_DIR]) == set(csv)
        query = urllib.parse.urlencode({"run": TENSORBOARD_DIR, "tag": "train/loss"})
        served = _get(f"{base}/scalars?{query}")  # [[wall_time, step, value], ...]
        assert [int(p[1]) for p in served] == [s for s, _ in csv["train/loss"]]
        np.testing.assert_allclose([p[2] for p in served], [v for _, v in csv["train/loss"]], rtol=1e-5)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
