"""Inference without waste (docs/design/evaluation.md, "Speed"): a checkpoint loads into an abstract model (no random
initialisation first) to exactly the parameters the initialised path gave, predict reuses the compiled model from
the persistent cache, and `bench predict` reports the phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import equinox as eqx
import jax
import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.inference.predictor import load_model
from confluence.model.transformer import RelationalTransformer, load_transformer
from confluence.toolkit.checkpoint import load_state, save_checkpoint
from tests.fixtures.model import tiny_run_config

STORE_SAMPLER = {"seq_len": 48, "max_rows": 16, "row_buckets": [16], "text_buckets": [64], "width": 4}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cfg = tiny_run_config(sampler=STORE_SAMPLER)
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(3)), eqx.is_inexact_array)
    path = tmp_path_factory.mktemp("speed") / "run"
    save_checkpoint(path, 0, params, None, {"config": cfg.to_dict()})
    return path


def test_abstract_load_gives_the_same_parameters_as_an_initialised_model(run):
    cfg = tiny_run_config(sampler=STORE_SAMPLER)
    like = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(0)), eqx.is_inexact_array)
    expected, _ = load_state(run, like)
    got = eqx.filter(load_transformer(cfg.model, run), eqx.is_inexact_array)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    assert load_model(run).model.cfg == cfg.model


def _predict_in_child(run, store, out, cache):
    """`confluence predict` in a fresh process with JAX's compile log: (seconds spent compiling _forward, cache hit)."""
    code = ("import jax, sys; jax.config.update('jax_log_compiles', True)\n"
            "from confluence.cli.main import main\n"
            f"sys.argv = ['confluence', 'predict', '--checkpoint', {str(run)!r}, '--db', {str(store)!r}, '--task',"
            f" 'order_rating', '--split', 'train', '-o', {str(out)!r}, '--no-progress', '--draws', '1']\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CONFLUENCE_COMPILE_CACHE": str(cache), "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr[-2000:]
    hit = "Persistent compilation cache hit for 'jit__forward'" in r.stderr
    return hit


@pytest.mark.slow
def test_a_second_predict_loads_the_compiled_model_and_answers_the_same(run, tiny_store, tmp_path):
    import pyarrow.parquet as pq

    cache = tmp_path / "cache"
    assert not _predict_in_child(run, tiny_store, tmp_path / "a.parquet", cache)  # compiled, then written
    assert any(cache.iterdir())
    assert _predict_in_child(run, tiny_store, tmp_path / "b.parquet", cache)  # loaded from the cache
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))


def test_bench_predict_reports_every_phase(run, tiny_store, tmp_path):
    out = tmp_path / "b.json"
    r = CliRunner().invoke(app, ["bench", "predict", "--db", str(tiny_store), "--task", "order_rating",
                                 "--checkpoint", str(run), "--anchors", "3", "--draws", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())["profiles"][0]
    assert p["contexts"] == p["anchors"] * 2 and p["anchors"] >= 1
    for key in ("load_s", "bind_s", "first_call_s", "assemble_s"):
        assert p[key] >= 0
    for key in ("sampling_contexts_per_s", "model_contexts_per_s", "pipeline_contexts_per_s"):
        assert p[key] > 0
    assert p["flops_per_context"] > 0 and "contexts/s: sampling" in r.output
    r = CliRunner().invoke(app, ["bench", "predict", "--db", str(tiny_store), "--task", "order_rating"])
    assert r.exit_code == 1 and "give one of --checkpoint and --config" in r.output
