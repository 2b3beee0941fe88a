"""The user guide's commands run as written (issue 52): every ```bash block of docs/guide/README.md preceded by the line
`<!-- guide:run -->` is run, in the guide's order, with bash (`set -euo pipefail`) in a fresh folder that holds a
copy of examples/shop (the guide's commands are written for the root of a clone), with the `confluence` of this
environment on PATH. A block that fails fails the test, with its output.

What the test changes, each replacement asserted present in the guide so that the two cannot drift apart:

- training length: the guide's `--budget 2m` becomes `--max-steps 30` (the run's length only);
- evaluation: `--draws 1` is added to the guide's `evaluate` (4 draws take over a minute on 2 CPU cores);
- the port: `8000` becomes a free port (CI machines may run something on 8000).

The serve block starts the server in the background (`&`) and waits for `/health`, as a user would; the test then
runs the curl block, checks that each answer is JSON holding a prediction, and stops the server's process group.
Besides, examples/shop's CSV files must be exactly what examples/shop/make_shop.py writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.net import free_port

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide" / "README.md"
SHOP = ROOT / "examples" / "shop"
MARK = "<!-- guide:run -->"
BLOCK = re.compile(r"^<!-- guide:run -->\n```bash\n(.*?)^```$", re.S | re.M)


def guide_blocks() -> list[str]:
    """The marked bash blocks of the guide, in order; every mark must precede a ```bash block."""
    text = GUIDE.read_text()
    blocks = BLOCK.findall(text)
    marks = len(re.findall(f"^{re.escape(MARK)}$", text, re.M))
    assert blocks and len(blocks) == marks, \
        f"{GUIDE}: {marks} marks but {len(blocks)} marked ```bash blocks (a mark must be the line before one)"
    return blocks


def replace(blocks: list[str], old: str, new: str) -> list[str]:
    """`blocks` with `old` replaced by `new`; `old` must occur in them (the guide and the test stay in step)."""
    assert any(old in b for b in blocks), f"the guide's marked blocks no longer hold {old!r}: update the test"
    return [b.replace(old, new) for b in blocks]


def test_the_shop_csv_files_are_what_make_shop_writes(tmp_path):
    sys.path.insert(0, str(SHOP))
    try:
        from make_shop import make_shop
    finally:
        sys.path.remove(str(SHOP))
    make_shop(tmp_path)
    for name in ("customers.csv", "products.csv", "orders.csv"):
        assert (tmp_path / name).read_bytes() == (SHOP / name).read_bytes(), \
            f"examples/shop/{name} differs from what make_shop.py writes: rerun it and commit both"


def _answers(text: str) -> list[dict]:
    """The JSON documents printed one after another (curl adds no newline)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        doc, i = dec.raw_decode(text, i)
        out.append(doc)


@pytest.mark.slow
def test_the_guide_runs_as_written(tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("the guide's serving step uses curl, which this machine lacks")
    blocks = guide_blocks()
    blocks = replace(blocks, "--budget 2m", "--max-steps 30")
    blocks = replace(blocks, "--blend gbdt --json metrics.json", "--blend gbdt --json metrics.json --draws 1")
    port = free_port()
    blocks = replace(blocks, "--port 8000", f"--port {port}")
    blocks = replace(blocks, "localhost:8000", f"localhost:{port}")

    work = tmp_path / "clone"
    shutil.copytree(SHOP, work / "examples" / "shop", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "COLUMNS": "100"}
    groups: list[int] = []  # process groups started (the server outlives its block)
    outputs: list[str] = []
    try:
        for i, block in enumerate(blocks):
            log = tmp_path / f"block{i}.log"
            start = time.monotonic()
            with open(log, "w") as f:  # a file, not a pipe: a server left running would hold a pipe open
                proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + block], cwd=work, env=env,
                                        stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
                groups.append(proc.pid)
                try:
                    rc = proc.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    rc = None
            out = log.read_text()
            outputs.append(out)
            took = time.monotonic() - start
            assert rc == 0, f"guide block {i} ({'timed out' if rc is None else f'exit {rc}'}, {took:.0f} s):\n" \
                            f"{block}\n--- output ---\n{out[-6000:]}"
            print(f"block {i}: {took:.1f} s: {block.splitlines()[0]}")
        # the last block asks the running server; each answer names its task and holds a prediction
        answers = _answers(outputs[-1])
        assert len(answers) == 2, outputs[-1]
        for a in answers:
            assert a["rows"] and "prediction" in a["rows"][0] and a["rows"][0]["prediction"] is not None, a
        assert [a["task"] for a in answers] == ["customer_orders_next_30d", "orders.amount"]
    finally:
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for pgid in groups:
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
            else:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    # what the guide's steps left behind
    assert (work / "shop-store").is_dir() and (work / "runs" / "shop" / "checkpoints").is_dir()
    assert (work / "runs" / "shop" / "report" / "report.html").stat().st_size > 10_000
    metrics = json.loads((work / "metrics.json").read_text())
    assert set(metrics) == {"orders.amount", "orders.status", "customer_orders_next_30d"}
    assert all("ship" in r for r in metrics.values())
    assert len((work / "status-test.csv").read_text().splitlines()) > 100
    assert len((work / "next30d.csv").read_text().splitlines()) == 4
