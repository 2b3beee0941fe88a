"""The HTML report renders the metrics table, marks the winner and plots the training curves."""

import math

from confluence.evaluation.report import write_report
from confluence.stypes import SemanticType


def test_report_writes_html_and_png(tmp_path):
    log = tmp_path / "train_log.csv"
    log.write_text("step,loss,loss_numerical,lr_muon\n1,2.0,1.5,0.01\n2,1.5,1.2,0.02\n3,1.1,,0.02\n")
    results = {
        "dep_delay": {"model": {"mae": 10.0}, "baseline": {"mae": 20.0}, "gbdt": {"mae": 12.0}},
        "cancelled": {"model": {"auroc": 0.7}, "baseline": {"auroc": 0.5}, "gbdt": {"auroc": math.nan}},
    }
    stypes = {"dep_delay": int(SemanticType.NUMERICAL), "cancelled": int(SemanticType.BOOLEAN)}
    path = write_report(tmp_path / "rep", results, stypes, train_log=log, notes={"machine": "test"})
    text = path.read_text()
    assert "dep_delay" in text and "gbdt" in text
    assert '<span class="best">10</span>' in text  # lower MAE wins
    assert '<span class="best">0.7</span>' in text  # higher AUROC wins
    assert (tmp_path / "rep" / "training_curves.png").stat().st_size > 1000
