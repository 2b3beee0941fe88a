"""`scripts/average_checkpoints.py`: the mean of several checkpoints' parameters, loadable for inference; never
written over an existing directory, never across model configs."""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np
import pytest

from confluence.errors import ConfluenceError
from confluence.inference.predictor import load_model
from confluence.model.transformer import RelationalTransformer
from confluence.toolkit.checkpoint import save_checkpoint
from scripts.average_checkpoints import average
from tests.fixtures.model import tiny_run_config


def _run(path, cfg, seed: int):
    params = eqx.filter(RelationalTransformer(cfg.model, key=jax.random.key(seed)), eqx.is_inexact_array)
    return save_checkpoint(path, seed + 1, params, None, {"config": cfg.to_dict()}), params


def test_the_average_is_the_leafwise_mean_and_loads_for_inference(tmp_path):
    cfg = tiny_run_config()
    (a, pa), (b, pb) = _run(tmp_path / "a", cfg, 0), _run(tmp_path / "b", cfg, 1)
    out = average(tmp_path / "avg", [str(a), str(b)])
    got = eqx.filter(load_model(out).model, eqx.is_inexact_array)
    for x, y, m in zip(jax.tree.leaves(pa), jax.tree.leaves(pb), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(m), (np.asarray(x) + np.asarray(y)) / 2, rtol=1e-6, atol=1e-7)
    assert not np.allclose(np.asarray(jax.tree.leaves(got)[0]), np.asarray(jax.tree.leaves(pa)[0]))
    with pytest.raises(ConfluenceError, match="exists"):
        average(tmp_path / "avg", [str(a), str(b)])


def test_checkpoints_of_different_models_are_refused(tmp_path):
    a, _ = _run(tmp_path / "a", tiny_run_config(), 0)
    b, _ = _run(tmp_path / "b", tiny_run_config(model={"n_heads": 4}), 1)
    with pytest.raises(ConfluenceError, match="different model configs"):
        average(tmp_path / "avg", [str(a), str(b)])
    assert not (tmp_path / "avg").exists()
