"""Package-level checks: the CLI loads and the shared batch contract holds."""

import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.batch import TrainingBatch
from confluence.cli.main import app
from confluence.stypes import SemanticType


def test_cli_help():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "relational" in result.output


def test_stype_parse():
    assert SemanticType.parse("Numerical") is SemanticType.NUMERICAL
    with pytest.raises(ValueError, match="unknown stype 'nope'"):
        SemanticType.parse("nope")


def _batch(b=2, s=8, r=3, u=1):
    z = lambda dt, *sh: np.zeros(sh or (b, s), dtype=dt)  # noqa: E731
    return TrainingBatch(
        semantic_types=z(np.int8), column_ids=z(np.int32), seq_row_ids=z(np.uint16), is_null=z(bool),
        numeric_values=z(np.float32), timestamp_values=z(np.float32, b, s, 15), bool_values=z(bool),
        categorical_embed_ids=z(np.uint32), text_embed_ids=z(np.uint32), is_target=z(bool), is_padding=z(bool),
        row_age=z(np.float32), child_rank=z(np.int16), arrival=z(np.int32),
        fk_adj=z(bool, b, r, r), col_perm=z(np.uint16), out_perm=z(np.uint16), in_perm=z(np.uint16),
        text_batch_embeddings=z(np.float16, u, 4), target_stype=1, task_idx=0, db_idx=0, cat_block_start=0,
        cat_count=0, seed_ids=z(np.int64, b), anchor_rows=z(np.int64, b), obs_times=z(np.int64, b),
        seq_valid=np.ones(b, bool),
    )


def test_batch_validate():
    batch = _batch()
    batch.validate()
    batch.column_ids = batch.column_ids.astype(np.int64)
    with pytest.raises(ValueError, match="column_ids"):
        batch.validate()
