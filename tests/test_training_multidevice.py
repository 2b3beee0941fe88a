"""Data parallelism: a step on 4 host CPU devices equals the step on 1 (run in a subprocess, since the device
count is fixed when JAX starts)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    assert len(jax.devices()) == 4, jax.devices()
    from confluence.model.inputs import DbTables, batch_to_inputs
    from confluence.toolkit.mesh import make_mesh, replicate
    from confluence.training.step import shard_inputs
    from tests.fixtures.model import tiny_batch, tiny_db, tiny_model, tiny_run_config, tiny_trainer

    cfg = tiny_run_config()
    db = tiny_db()
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    batches = [batch_to_inputs(tiny_batch(db, task=i, seed=(0, 0, 0))) for i in (0, 3)]
    tr = tiny_trainer(cfg)
    results = []
    for n_dev in (1, 4):
        mesh = make_mesh(n_dev)
        params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
        tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
        for i, b in enumerate(batches):
            inp = shard_inputs(b, mesh)
            if n_dev == 4:
                assert len(inp["is_target"].sharding.device_set) == 4
                assert inp["is_target"].addressable_shards[0].data.shape[0] == 1  # B=4 split over 4 devices
            params, opt, m = tr.step(params, opt, [(inp, *tabs)], i)
        results.append(([np.asarray(x) for x in jax.tree.leaves(params)], float(m.loss)))
    (p1, l1), (p4, l4) = results
    assert abs(l1 - l4) < 1e-5 * max(1.0, abs(l1)), (l1, l4)
    for a, b in zip(p1, p4, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    print("OK", l1, l4)
    """
)


@pytest.mark.slow
def test_step_on_four_host_devices_equals_one_device():
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(root))
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK" in res.stdout
