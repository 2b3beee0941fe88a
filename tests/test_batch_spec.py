"""The one batch specification (`confluence.batch.SEQ_FIELDS`): what allocates a batch's tensors, what `validate`
checks and what the model's inputs list are the same fields."""

import dataclasses

import numpy as np
import pytest

from confluence.batch import CHILD_RANK_UNKNOWN, ROW_AGE_UNKNOWN, SEQ_FIELDS, TrainingBatch, seq_arrays
from confluence.model.inputs import BATCH_AXIS_FIELDS
from confluence.stypes import D_TIME


def test_seq_arrays_follow_the_spec_with_its_fills_and_named_overrides():
    a = seq_arrays(3, 5, is_padding=True)
    assert list(a) == list(SEQ_FIELDS)
    for name, f in SEQ_FIELDS.items():
        assert a[name].dtype == f.dtype and a[name].shape == f.shape(3, 5)
    assert a["timestamp_values"].shape == (3, 5, D_TIME)
    assert (a["row_age"] == ROW_AGE_UNKNOWN).all() and (a["child_rank"] == CHILD_RANK_UNKNOWN).all()
    assert a["is_padding"].all() and not a["is_target"].any()
    with pytest.raises(ValueError, match="no batch field"):
        seq_arrays(1, 1, padding=True)


def test_every_seq_field_is_a_batch_field_and_a_model_input():
    names = {f.name for f in dataclasses.fields(TrainingBatch)}
    assert set(SEQ_FIELDS) <= names
    assert set(SEQ_FIELDS) <= set(BATCH_AXIS_FIELDS)


def test_validate_names_a_field_that_breaks_the_spec():
    from confluence.bench.synthetic import SyntheticDatabase

    batch = SyntheticDatabase().batch(0, 2, 16, 4)
    batch.validate()
    bad = dataclasses.replace(batch, row_age=batch.row_age.astype(np.float64))
    with pytest.raises(ValueError, match="TrainingBatch.row_age"):
        bad.validate()
