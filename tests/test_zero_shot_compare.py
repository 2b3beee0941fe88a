"""`scripts/zero_shot_compare.py compare`: the pretraining studies' tally of one model's validation results against
another's (above trivial, better / worse per task, the error ratio on numbers and times, real databases apart)."""

from __future__ import annotations

import json
import math

from scripts.zero_shot_compare import compare


def _task(stype: str, metric: str, model: float, trivial: float) -> dict:
    return {"model": {metric: model}, "baseline": {metric: trivial}, "info": {"stype": stype}}


def test_compare_counts_tasks_above_trivial_wins_and_the_error_ratio(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "shop.json").write_text(json.dumps({
        "orders.late": _task("boolean", "auroc", 0.60, 0.5),        # above, B falls under chance
        "orders.amount": _task("numerical", "mae", 10.0, 12.0),     # above; B's error halves
        "orders.kind": _task("categorical", "accuracy", 0.40, 0.45),  # under the majority; B passes it
        "orders.empty": {"info": {"stype": "boolean"}},             # not scored: left out
    }))
    (b / "shop.json").write_text(json.dumps({
        "orders.late": _task("boolean", "auroc", 0.45, 0.5),
        "orders.amount": _task("numerical", "mae", 5.0, 12.0),
        "orders.kind": _task("categorical", "accuracy", 0.50, 0.45),
    }))
    (a / "other.json").write_text(json.dumps({"t.x": _task("numerical", "mae", 2.0, 1.0)}))  # B lacks it: skipped
    t = compare(a, b, real={"shop"}, show_all=False)
    assert (t["tasks"], t["a"], t["b"], t["better"], t["worse"]) == (3, 2, 2, 2, 1)
    assert (t["real"], t["real_a"], t["real_b"]) == (3, 2, 2)
    assert math.isclose(t["error_ratio"], 0.5) and math.isclose(t["real_error_ratio"], 0.5)
    listed = capsys.readouterr().out
    assert "orders.late" in listed and "orders.kind" in listed and "  shop           orders.amount" not in listed
