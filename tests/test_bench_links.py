"""`confluence bench links` (the ranking-cost table of link tasks) on the tiny bookstore link task: it runs in
seconds with small options, prints every row of its one table and writes every figure, finite and positive."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from confluence.bench.links import finite_positive, table_rows
from confluence.cli.main import app
from tests.fixtures.model import tiny_run_config
from tests.test_link_model import SAMPLER, TASK, store  # noqa: F401  (the module's store fixture)


def test_bench_links_prints_and_writes_every_figure(store, tmp_path):  # noqa: F811
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_run_config(sampler=SAMPLER, link={"item_cells": 32}).to_dict()))
    out = tmp_path / "links.json"
    res = CliRunner().invoke(app, [
        "bench", "links", "--db", str(store.path), "--task", TASK, "--config", str(config), "--size", "100",
        "--size", "2000", "--dim", "16", "--anchors", "8", "--k", "5", "--key-rows", "40", "--train-steps", "2",
        "--warmup", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert [(r["n"], r["d"]) for r in data["topk"]] == [(100, 16), (2000, 16)]
    assert [r["what"] for r in data["train"]] == ["train_links, catalogue on", "train_links, catalogue off",
                                                 "train, cell tasks"]
    assert data["keys"]["rows"] == 40 and data["keys"]["d"] == 16
    assert set(data["keys"]["seconds_to_key"]) == {"100", "2000", str(data["keys"]["target_rows"])}
    assert finite_positive(data)
    for what, _, value, unit in table_rows(data):
        assert math.isfinite(value) and value > 0, what
        assert what.strip() in res.output and unit in res.output
    for column in ("what", "setting", "value", "unit"):
        assert column in res.output
