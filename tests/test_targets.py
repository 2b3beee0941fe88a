"""The target kinds' contract (`confluence.targets`): every kind answers each question the rest of the package asks
it, consistently with itself; the registry refuses a type no target can have."""

import math

import numpy as np
import pytest

from confluence.stypes import US_PER_DAY, SemanticType
from confluence.targets import KINDS, kind

RNG = np.random.default_rng(0)
N, K = 40, 3


def _example(st: SemanticType) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(truth, a predictor, another predictor) in the kind's units."""
    if st == SemanticType.BOOLEAN:
        y = np.arange(N) % 2 == 0
        return y, np.clip(y * 0.6 + RNG.uniform(0, 0.4, N), 0, 1), RNG.uniform(0, 1, N)
    if st == SemanticType.CATEGORICAL:
        y = np.arange(N) % K
        a = np.full((N, K), 0.1)
        a[np.arange(N), y] = 0.8
        b = RNG.dirichlet(np.ones(K), N)
        return y, a, b
    scale = US_PER_DAY if st == SemanticType.TIMESTAMP else 1.0
    y = RNG.normal(0, 10, N) * scale + (1.7e15 if st == SemanticType.TIMESTAMP else 0.0)
    y = np.round(y) if st == SemanticType.TIMESTAMP else y  # whole microseconds, as stored
    return y, y + RNG.normal(0, 1, N) * scale, y + RNG.normal(0, 5, N) * scale


@pytest.mark.parametrize("st", list(KINDS))
def test_each_kind_keeps_its_own_contract(st):
    k = kind(st)
    assert k.stype == st and kind(int(st)) is k
    y, a, b = _example(st)
    m = k.metrics(y, a, target_std=k.target_std(y))
    metric, higher = k.headline
    assert metric in m and m["n"] == N and math.isfinite(m[metric])
    # the better predictor wins on the headline metric, in the direction the kind says
    better, worse = m[metric], k.metrics(y, b, target_std=k.target_std(y))[metric]
    assert (better > worse) if higher else (better < worse)
    rows = k.per_row_scores(y, a)
    if rows is not None:  # where the headline decomposes, it is the mean of the per-row scores
        assert rows.shape == (N,) and float(np.mean(rows)) == pytest.approx(m[metric], rel=1e-9)
    # blending: the model's share 1 is the model, 0 the partner
    np.testing.assert_allclose(k.blend(a, b, 1.0), a)
    np.testing.assert_allclose(k.blend(a, b, 0.0), b)
    # the trivial baselines are constants shaped as predictions of the kind, scored by the same metrics
    trivial = k.trivial_predictions(y, N, K if k.has_classes else None)
    assert trivial
    for pred in trivial.values():
        assert len(pred) == N and np.all(pred == pred[0])
        assert metric in k.metrics(y, pred)
    assert k.empty_predictions(K).shape == ((0, K) if k.has_classes else (0,))


@pytest.mark.parametrize("st", list(KINDS))
def test_lightgbm_label_reads_back_to_the_target(st):
    """What a kind gives LightGBM to fit, read back through `gbdt_output`, is the target itself for the regressions
    (a perfect booster's raw output is the label it fitted) and the label's own encoding for the classifiers."""
    k = kind(st)
    y, _, _ = _example(st)
    obs = None
    if st == SemanticType.TIMESTAMP:
        obs = (y - 3 * US_PER_DAY).astype(np.int64)
    label, params, fit = k.gbdt_target(y, obs, K)
    assert "objective" in params
    if st in (SemanticType.NUMERICAL, SemanticType.TIMESTAMP):
        np.testing.assert_allclose(k.gbdt_output(label, N, K, fit, obs), y, rtol=0, atol=1e-3 * (
            US_PER_DAY if st == SemanticType.TIMESTAMP else 1e-6))
        if st == SemanticType.TIMESTAMP:  # regressed as the offset from the observation time: 3 days every row
            assert fit["relative"] and np.allclose(label, 0.0)
    elif st == SemanticType.CATEGORICAL:
        assert params["num_class"] == K
        raw = np.eye(K)[y].ravel()
        assert k.gbdt_output(raw, N, K, fit, obs).shape == (N, K)


def test_a_type_no_target_can_have_is_refused_by_name():
    for st in (SemanticType.TEXT, SemanticType.IDENTIFIER, SemanticType.IGNORED):
        with pytest.raises(ValueError, match=st.label):
            kind(st)


def test_a_kind_must_answer_every_required_question():
    """The interface's required methods are abstract: a kind that leaves one out cannot be made."""
    from confluence.targets.base import TargetKind
    from confluence.targets.numerical import Numerical

    class Partial(TargetKind):
        stype = SemanticType.NUMERICAL
        headline = ("mae", False)
        plot = "predicted_vs_actual"
        decode = Numerical.decode

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_what_each_kind_explains():
    """`TargetKind.explained`: a number as it is, a class as the log-odds of the class predicted in the
    reference (true for a boolean), a time in days; an explanation's effects are differences of these."""
    num = kind(SemanticType.NUMERICAL)
    np.testing.assert_array_equal(num.explained(np.array([1.5, -2.0]), np.array([0.0, 0.0])), [1.5, -2.0])
    boolean = kind(SemanticType.BOOLEAN)
    np.testing.assert_allclose(boolean.explained(np.array([0.5, 0.9]), np.array([0.5, 0.9])), [0.0, np.log(9.0)])
    cat = kind(SemanticType.CATEGORICAL)
    ref = np.array([[0.2, 0.8], [0.6, 0.4]])
    np.testing.assert_allclose(cat.explained(np.array([[0.5, 0.5], [0.9, 0.1]]), ref), [0.0, np.log(9.0)])
    ts = kind(SemanticType.TIMESTAMP)
    np.testing.assert_allclose(ts.explained(np.array([2.0 * US_PER_DAY]), np.zeros(1)), [2.0])
    assert np.isfinite(boolean.explained(np.array([0.0, 1.0]), np.zeros(2))).all()  # clipped, never infinite


def test_each_kind_states_an_answer_as_a_user_reads_it():
    """`point` then `value_text`: the class's name, true / false, the number, the ISO time."""

    class _Store:
        columns = []

    class _Task:
        stats = {"categories": ["red", "blue"]}

    cat = kind(SemanticType.CATEGORICAL)
    assert cat.value_text(_Store(), _Task(), cat.point(np.array([[0.2, 0.8]]))[0]) == "'blue'"
    boolean = kind(SemanticType.BOOLEAN)
    assert [boolean.value_text(None, None, v) for v in boolean.point(np.array([0.7, 0.2]))] == ["true", "false"]
    assert kind(SemanticType.NUMERICAL).value_text(None, None, 2.5) == "2.5"
    assert kind(SemanticType.TIMESTAMP).value_text(None, None, 86_400_000_000) == "1970-01-02T00:00:00"


@pytest.mark.parametrize("st", list(KINDS))
def test_each_kind_stores_its_targets_in_its_own_array(st):
    from confluence.targets.base import TARGET_ARRAYS

    k = kind(st)
    dtype, shape = TARGET_ARRAYS[k.storage]
    values = np.ones((5,) + shape[1:], dtype)
    arrays = k.target_arrays(values)
    assert set(arrays) == set(TARGET_ARRAYS) and arrays[k.storage] is values
    for name, (d, s) in TARGET_ARRAYS.items():
        if name != k.storage:
            assert arrays[name].shape == s and arrays[name].dtype == d
    unknown = k.unknown_targets(10, cat_block_start=7)[k.storage]
    assert unknown.dtype == dtype and unknown.shape[0] == (2 if k.storage == "bits" else 10)
    assert np.all(unknown == (7 if k.has_classes else 0))  # a categorical's ids stay in its block


@pytest.mark.parametrize("st", list(KINDS))
def test_recoding_touches_only_the_tasks_own_answers(st):
    """A re-coded context changes the task's column (or a categorical's block) and nothing else; a kind that does not
    re-code leaves every cell as it is."""
    from types import SimpleNamespace

    from confluence.batch import seq_arrays

    k, s = kind(st), 12
    out = seq_arrays(1, s)
    out["semantic_types"][0] = int(st)
    out["column_ids"][0] = np.where(np.arange(s) < 6, 3, 4)  # cells 0-5 of the task's column 3, 6-11 of column 4
    out["numeric_values"][0] = np.arange(s, dtype=np.float32)
    out["bool_values"][0] = np.arange(s) % 2 == 0
    out["categorical_embed_ids"][0] = np.where(np.arange(s) < 6, 10 + np.arange(s) % 3, 50)  # block 10..12
    task = SimpleNamespace(target_col=3, cat_block_start=10, cat_count=3)
    before = {n: a.copy() for n, a in out.items()}
    changed = False
    for seed in range(8):  # some draw changes something (a permutation may be the identity)
        k.recode(out, 0, task, np.random.default_rng(seed))
        changed |= any(not np.array_equal(before[n], out[n]) for n in out)
    assert changed == k.recodes
    for n, a in out.items():
        np.testing.assert_array_equal(a[0, 6:], before[n][0, 6:], err_msg=n)  # column 4 / outside the block
