"""Project-wide pytest configuration and the pytest fixtures built from `tests/fixtures/` (stores preprocessed once
per session through the real pipeline)."""

import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# commands run in tests keep their compiled models in a folder of the test session, not in ~/.cache
os.environ.setdefault("CONFLUENCE_COMPILE_CACHE", tempfile.mkdtemp(prefix="confluence-test-jax-"))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory):
    """The tiny bookstore preprocessed with the hashing text encoder of the tiny model's D_t (8): a real store the
    training, evaluation and prediction tests run the tiny model on."""
    from tests.fixtures.bookstore import build_bookstore
    from tests.fixtures.model import D_T

    return build_bookstore(tmp_path_factory.mktemp("tiny_store"), "tiny", dim=D_T)


@pytest.fixture(scope="session")
def small_planted_store(tmp_path_factory):
    """A small planted database (120 customers, about 8 orders each) preprocessed with the hashing text encoder: real
    derived tasks with observation times, for the sampler's per-cell time fields (row ages, recency ranks)."""
    from confluence.preprocess.pipeline import preprocess
    from confluence.store import Store
    from confluence.synth.planted import PlantedSpec, write_planted
    from tests.fixtures.bookstore import HashEncoder

    root = tmp_path_factory.mktemp("small_planted")
    db = write_planted(root / "db", PlantedSpec(seed=5, customers=120, stores=6, regions=3, orders_per_customer=8.0))
    return Store.open(preprocess(db / "raw", db / "planted.metadata.json", root / "store",
                                 encoder=HashEncoder(16), progress=False))
