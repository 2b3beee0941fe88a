"""Two processes joined through `jax.distributed` (CPU, gloo collectives), each with its own local half-batch and
its own batch-local text table: the data-parallel step equals one process stepping on the concatenated batch."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from confluence.model.inputs import BATCH_AXIS_FIELDS, DbTables, batch_to_inputs
from confluence.toolkit.mesh import make_mesh, replicate
from confluence.training.step import shard_inputs
from tests.fixtures.model import tiny_db, tiny_model, tiny_run_config, tiny_trainer
from tests.fixtures.net import free_port

TASKS = (0, 3)

WORKER = textwrap.dedent(
    """
    import sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import numpy as np
    from confluence.model.inputs import DbTables, batch_to_inputs
    from confluence.toolkit.mesh import make_mesh, replicate
    from confluence.training.step import shard_inputs
    from tests.fixtures.model import tiny_db, tiny_model, tiny_run_config, tiny_trainer

    cfg = tiny_run_config()
    db = tiny_db()
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    tr = tiny_trainer(cfg)
    mesh = make_mesh()
    assert mesh.devices.size == 2 and jax.process_count() == 2
    params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
    tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
    for step, task in enumerate((0, 3)):  # = TASKS
        local = db.batch(task, 2, 32, 8, seed=(pid, step))  # this process's half of the global batch
        params, opt, m = tr.step(params, opt, [(shard_inputs(batch_to_inputs(local), mesh), *tabs)], step)
    if pid == 0:
        leaves = [np.asarray(x.addressable_data(0)) for x in jax.tree.leaves(params)]
        np.savez(out, loss=float(np.asarray(m.loss.addressable_data(0))), *leaves)
    print("done", pid, flush=True)
    """
)


def _concat(b0, b1):
    """One B=4 batch from two local B=2 batches: text tables stacked, the second half's text ids shifted."""
    i0, i1 = batch_to_inputs(b0), batch_to_inputs(b1)
    u = i0["text_batch_embeddings"].shape[0]
    assert i1["text_batch_embeddings"].shape[0] == u
    out = dict(i0)
    for name in BATCH_AXIS_FIELDS:
        x1 = i1[name] + np.uint32(u) if name == "text_embed_ids" else i1[name]
        out[name] = np.concatenate([i0[name], x1])
    out["text_batch_embeddings"] = np.concatenate([i0["text_batch_embeddings"], i1["text_batch_embeddings"]])
    return out


@pytest.mark.slow
def test_two_processes_equal_one_process_on_the_concatenated_batch(tmp_path):
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
    env.pop("XLA_FLAGS", None)
    port, out = str(free_port()), tmp_path / "params.npz"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(pid), port, str(out)], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for pid in (0, 1)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)

    cfg = tiny_run_config()
    db = tiny_db()
    tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
    tr = tiny_trainer(cfg)
    mesh = make_mesh(1)
    params, opt = (replicate(x, mesh) for x in tr.init_state(tiny_model(cfg.model)))
    tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
    for step, task in enumerate(TASKS):
        both = _concat(db.batch(task, 2, 32, 8, seed=(0, step)), db.batch(task, 2, 32, 8, seed=(1, step)))
        params, opt, m = tr.step(params, opt, [(shard_inputs(both, mesh), *tabs)], step)
    got = np.load(out)
    assert float(got["loss"]) == pytest.approx(float(m.loss), rel=1e-5)
    ref = [np.asarray(x) for x in jax.tree.leaves(params)]
    for i, a in enumerate(ref):
        np.testing.assert_allclose(got[f"arr_{i}"], a, rtol=1e-4, atol=1e-6)
