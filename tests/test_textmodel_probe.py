"""The encoder comparison (linear probe + retrieval) and the training-curve plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from confluence.errors import ConfluenceError
from confluence.textenc.probe import retrieval_scores, run_probe
from confluence.textmodel.report import plot_curves


def test_retrieval_scores_hand_made() -> None:
    train_x = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    train_y = np.array([0, 1, 1])
    test_x = np.array([[0.9, 0.1], [0.1, 0.9], [1.0, 0.05]])
    test_y = np.array([0, 1, 1])
    # nearest: 0 (hit), 1 (hit), 0 (miss; first label-1 neighbour is rank 2)
    knn1, mrr = retrieval_scores(train_x, train_y, test_x, test_y)
    assert knn1 == pytest.approx(2 / 3) and mrr == pytest.approx((1 + 1 + 0.5) / 3)


def test_probe_separates_topics_with_tfidf(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    topics = {"air": ["flight", "runway", "pilot", "gate"], "sea": ["ship", "harbour", "sail", "tide"],
              "rail": ["train", "track", "station", "rail"]}
    texts, labels = [], []
    for lab, words in topics.items():
        for _ in range(60):
            texts.append(" ".join(rng.choice(words + ["the", "a", "of", "near"], 8)))
            labels.append(lab)
    pq.write_table(pa.table({"text": texts, "package": labels}), tmp_path / "c.parquet")
    rows = run_probe(tmp_path / "c.parquet", ["tfidf"], max_docs=1000, min_per_class=10)
    assert rows[0]["num_classes"] == 3 and rows[0]["probe_acc"] > 0.9 and rows[0]["knn1"] > 0.9
    with pytest.raises(ConfluenceError, match="fewer than 2 packages"):
        run_probe(tmp_path / "c.parquet", ["tfidf"], min_per_class=100)


def test_plot_curves(tmp_path: Path) -> None:
    from confluence.toolkit.logs import ScalarLog

    log = ScalarLog(tmp_path / "scalars.csv")
    log.write(1, {"train/total": 3.0, "train/decoder": 5.0, "perf/seconds": 0.1})
    log.write(2, {"train/total": 2.5, "train/decoder": 4.0, "perf/seconds": 0.2})
    log.close()
    out = plot_curves(tmp_path, tmp_path / "img" / "c.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ConfluenceError, match="no scalars.csv"):
        plot_curves(tmp_path / "img", tmp_path / "x.png")
