"""The HTML report: one self-contained page (images as data: URIs) that says what each task asks, how many rows were
scored, the model beside the trivial and GBDT baselines with a verdict (the model-vs-GBDT gain oriented so positive
means the model is better), the plots of the evaluated rows, every metric with the headline first, and the
training curves; checked in a real headless Chromium where one is installed."""

import io
import json
import math
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from confluence.cli.eval_cmds import gain_text
from confluence.evaluation import metrics as M
from confluence.evaluation.evaluate import EvalRows, clean_json, write_json
from confluence.evaluation.report import (
    describe_task,
    oriented_vs_gbdt,
    plot_confusion,
    render_report,
    task_descriptions,
    task_metrics_html,
    verdict,
    write_report,
)
from confluence.stypes import US_PER_DAY, SemanticType

N = 240
DESCRIPTIONS = {
    "flights.dep_delay": "predict the numerical column dep_delay of a flights row: departure delay in minutes",
    "flights.cancelled": "predict the boolean column cancelled of a flights row: the flight never departed",
    "flights.carrier": "predict carrier (categorical) of a flights row at an observation time: airline",
    "flights.dep_at": "predict the timestamp column dep_at of a flights row: actual departure",
}
STYPES = {"flights.dep_delay": SemanticType.NUMERICAL, "flights.cancelled": SemanticType.BOOLEAN,
          "flights.carrier": SemanticType.CATEGORICAL, "flights.dep_at": SemanticType.TIMESTAMP}


def _entry(stype: SemanticType, truth: np.ndarray, pred: np.ndarray, gbdt: np.ndarray, trivial: dict,
           categories: list[str] | None = None) -> dict:
    """A task's results the way `evaluate(gbdt=True, keep_rows=True)` lays them out, from synthetic rows."""
    best_name, best = M.best_baseline(stype, trivial)
    return {"model": M.metrics_for(stype, truth, pred), "baseline": {**best, "name": best_name}, **trivial,
            "gbdt": M.metrics_for(stype, truth, gbdt),
            "model_vs_gbdt": M.paired_bootstrap(stype, truth, pred, gbdt, n_boot=200),
            "info": {"stype": stype.label, "split": "test", "n_eval": N + 7, "n_eval_non_null": N, "n_train": 5000,
                     "checkpoint_step": 100},
            "rows": EvalRows(truth=truth, pred=pred, gbdt=gbdt, categories=categories)}


def small_results() -> dict:
    """Four tasks, one per target type, of N rows each (the model better than the GBDT on numbers and classes)."""
    rng = np.random.default_rng(0)
    y = rng.normal(10, 20, N)
    num = _entry(SemanticType.NUMERICAL, y, y + rng.normal(0, 5, N), y + rng.normal(0, 15, N),
                 M.trivial_baselines(SemanticType.NUMERICAL, rng.normal(10, 20, 500), y))
    b = rng.random(N) < 0.3
    p = np.clip(0.3 + 0.4 * (b - 0.3) + rng.normal(0, 0.15, N), 0.01, 0.99)
    boolean = _entry(SemanticType.BOOLEAN, b, p, np.clip(p + rng.normal(0, 0.1, N), 0.01, 0.99),
                     M.trivial_baselines(SemanticType.BOOLEAN, rng.random(500) < 0.3, b))
    k = 14  # more classes than the confusion matrix shows: the rare ones are pooled
    c = np.minimum(rng.geometric(0.3, N) - 1, k - 1)
    probs = rng.dirichlet(np.ones(k), N)
    probs[np.arange(N), c] += 0.15
    probs /= probs.sum(1, keepdims=True)
    cat = _entry(SemanticType.CATEGORICAL, c, probs, rng.dirichlet(np.ones(k), N),
                 M.trivial_baselines(SemanticType.CATEGORICAL, c, c, num_classes=k),
                 categories=[f"carrier {i}" for i in range(k)])
    t = 1.357e15 + rng.uniform(0, 365, N) * US_PER_DAY
    ts = _entry(SemanticType.TIMESTAMP, t, t + rng.normal(0, 3, N) * US_PER_DAY,
                t + rng.normal(0, 20, N) * US_PER_DAY, M.trivial_baselines(SemanticType.TIMESTAMP, t, t))
    return {"flights.dep_delay": num, "flights.cancelled": boolean, "flights.carrier": cat, "flights.dep_at": ts}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of `small_results` with a training log, written once for the tests that read it."""
    tmp = tmp_path_factory.mktemp("report")
    log = tmp / "scalars.csv"
    log.write_text("step,loss,loss_numerical,lr_muon\n1,2.0,1.5,0.01\n2,1.5,1.2,0.02\n3,1.1,,0.02\n")
    return write_report(tmp / "rep", small_results(), {t: int(s) for t, s in STYPES.items()},
                        descriptions=DESCRIPTIONS, train_log=log, notes={"machine": "test"})


def test_report_is_one_self_contained_page(report):
    path = report
    text = path.read_text()
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.html"]  # no PNG beside it
    srcs = re.findall(r'<img src="([^"]*)"', text)
    # training curves + one plot per task (calibration, confusion matrix, two predicted-vs-actual)
    assert len(srcs) == 5 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert not re.search(r'(?:src|href)="(?!data:)', text) and "url(" not in text and "@import" not in text


def test_report_says_what_each_task_asks_n_and_a_verdict(report):
    text = report.read_text()
    for desc in DESCRIPTIONS.values():
        assert desc in text
    assert "<th>verdict</th>" in text and "<th>n</th>" in text
    assert text.count("<td>240</td>") >= 4  # n scored per task in the headline table
    assert "beats trivial" in text and "better than GBDT" in text
    assert "positive always means the model is better" in text


def test_gain_over_gbdt_is_positive_when_the_model_is_better():
    # MAE: model 10, GBDT 12 -> model - GBDT = -2, the model better by +2
    assert oriented_vs_gbdt({"diff": -2.0, "ci_low": -3.0, "ci_high": -1.0}, higher=False) == (2.0, 1.0, 3.0)
    # AUROC: model 0.7, GBDT 0.75 -> the model better by -0.05
    assert oriented_vs_gbdt({"diff": -0.05, "ci_low": -0.08, "ci_high": -0.02}, higher=True) == (-0.05, -0.08, -0.02)
    assert oriented_vs_gbdt({"diff": None}, higher=True) is None  # JSON null
    # an exact tie of an error (the guarded blend is LightGBM) reads +0, not -0
    assert all(math.copysign(1.0, v) == 1.0 for v in oriented_vs_gbdt({"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0},
                                                                        higher=False))
    assert gain_text({"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0}, higher=False) == "  +0 [+0, +0]"


def test_verdict_follows_the_interval():
    num = SemanticType.NUMERICAL
    base = {"model": {"mae": 10.0}, "baseline": {"mae": 20.0}, "gbdt": {"mae": 11.0}}
    worse = {**base, "model_vs_gbdt": {"diff": 1.0, "ci_low": 0.5, "ci_high": 1.5, "a_not_worse": 0.0}}
    same = {**base, "model_vs_gbdt": {"diff": -1.0, "ci_low": -2.0, "ci_high": 0.5, "a_not_worse": 1.0}}
    better = {**base, "model_vs_gbdt": {"diff": -1.0, "ci_low": -2.0, "ci_high": -0.5, "a_not_worse": 1.0}}
    assert [t for t, _ in verdict(worse, num)] == ["beats trivial", "worse than GBDT"]
    assert [t for t, _ in verdict(same, num)] == ["beats trivial", "not worse than GBDT"]
    assert [t for t, _ in verdict(better, num)] == ["beats trivial", "better than GBDT"]
    lost = {"model": {"auroc": 0.5}, "baseline": {"auroc": 0.5}}
    assert [t for t, _ in verdict(lost, SemanticType.BOOLEAN)] == ["not better than trivial"]
    no_ci = {**base, "gbdt": {"mae": 9.0}}
    assert verdict(no_ci, num)[1] == ("< GBDT (no interval)", "meh")


def test_all_metrics_put_the_headline_first_and_mark_the_best_trivial():
    r = {"model": {"log_loss": 0.5, "accuracy": 0.8, "auroc": 0.9, "n": 10.0},
         "baseline": {"auroc": 0.5, "accuracy": 0.7, "log_loss": 0.6, "n": 10.0, "name": "majority"},
         "majority": {"auroc": 0.5, "accuracy": 0.7, "log_loss": 0.6, "n": 10.0}}
    table = task_metrics_html(r, SemanticType.BOOLEAN)
    assert re.findall(r"<th>([^<]+)</th>", table) == ["auroc", "accuracy", "log_loss", "n"]
    assert "(best trivial)" in table and ">baseline<" not in table


def test_report_renders_json_results_without_rows_or_stypes(tmp_path):
    """`confluence evaluate --json` loaded back (NaN as null, no rows): types from info.stype, no plots."""
    results = json.loads(json.dumps(clean_json(small_results())))
    assert all("rows" not in r for r in results.values())
    results["flights.dep_delay"]["gbdt"]["r2"] = None
    text = render_report(results)
    assert len(re.findall(r"<img ", text)) == 0 and "MAE (days) ↓" in text and "<td>240</td>" in text


def test_write_json_drops_the_rows(tmp_path):
    path = write_json(small_results(), tmp_path / "m.json")
    data = json.loads(path.read_text())
    assert set(data["flights.carrier"]) == {"model", "baseline", "majority", "gbdt", "model_vs_gbdt", "info"}


def test_confusion_matrix_pools_rare_classes():
    from PIL import Image

    rng = np.random.default_rng(1)
    y = rng.integers(0, 40, 500)
    png = plot_confusion(y, np.eye(40)[y], [f"c{i}" for i in range(40)], max_classes=6)
    img = Image.open(io.BytesIO(png))
    assert img.format == "PNG" and 300 < img.width < 1000  # 7 x 7 cells, not 40 x 40


def test_task_descriptions_come_from_the_store(tiny_store):
    from confluence.store import Store

    store = Store.open(tiny_store)
    descs = task_descriptions(store)
    assert set(descs) == {t.name for t in store.tasks}
    for t in store.tasks:
        col = store.columns[t.target_column_idx]
        assert col.name in descs[t.name] and t.anchor_table in descs[t.name]
        assert descs[t.name].startswith("predict ") and descs[t.name] == describe_task(store, t.name)
        if not t.is_derived:
            assert f"the {t.target_stype.label} column {col.name} of a {t.anchor_table} row" in descs[t.name]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html_path, png_path, width: int, height: int) -> None:
    """Render a page in headless Chromium (Debian's `chromium`) and save a `width` x `height` screenshot."""
    args = [_chromium(), "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={png_path.parent / 'chromium-profile'}", f"--window-size={width},{height}",
            f"--screenshot={png_path}", html_path.resolve().as_uri()]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    subprocess.run(args, check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(_chromium() is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_report_in_a_real_browser(report, tmp_path):
    from PIL import Image

    path = report
    text = path.read_text()
    assert all(s.startswith("data:") for s in re.findall(r'<img src="([^"]*)"', text))
    shot = tmp_path / "shot.png"
    screenshot(path, shot, 1280, 1600)
    img = Image.open(shot)
    assert img.size == (1280, 1600)
    pixels = np.asarray(img.convert("L"), np.float64)
    assert pixels.std() > 20  # text, tables and plots, not a blank page
    # the plots rendered: the lower half of the window (task cards) has many non-white pixels too
    assert (pixels[800:] < 200).mean() > 0.02
    assert not math.isnan(pixels.mean())


@pytest.mark.slow
def test_evaluate_keeps_the_scored_rows_and_the_report_plots_them(tiny_store, tmp_path):
    """`evaluate(keep_rows=True)` on a trained tiny model: per task the non-null targets and the predictions the
    metrics were computed from (recomputing the headline metric from them gives the reported value); the JSON file
    leaves them out; the report draws one plot per task from them."""
    from confluence.evaluation.evaluate import evaluate
    from confluence.store import Store
    from confluence.training.loop import open_stream, train
    from tests.fixtures.model import tiny_run_config

    cfg = tiny_run_config(loop={"max_steps": 2, "ckpt_every": 2, "val_every": 2})
    with open_stream([tiny_store], cfg) as stream:
        train(cfg, stream, tmp_path / "run", progress=False)
    results = evaluate(tmp_path / "run", tiny_store, split="train", keep_rows=True, batch_size=4)
    scored = {t: r for t, r in results.items() if "rows" in r}
    assert scored and all("rows" in r for r in results.values() if "model" in r)
    for task, r in scored.items():
        rows, stype = r["rows"], SemanticType.parse(r["info"]["stype"])
        assert isinstance(rows, EvalRows) and len(rows.truth) == len(rows.pred) == r["info"]["n_eval_non_null"]
        metric, _ = M.HEADLINE[stype]
        recomputed = M.metrics_for(stype, rows.truth, rows.pred)[metric]
        assert recomputed == pytest.approx(r["model"][metric], nan_ok=True), task
    assert "rows" not in json.loads(write_json(results, tmp_path / "m.json").read_text())[next(iter(scored))]
    store = Store.open(tiny_store)
    text = write_report(tmp_path / "rep", results, descriptions=task_descriptions(store)).read_text()
    plotted = sum(len(r["rows"].truth) > 0 for r in scored.values())
    assert plotted and len(re.findall(r'<img src="data:image/png;base64,', text)) == plotted


@pytest.mark.slow
def test_evaluate_cli_writes_the_report_and_replaces_only_its_own(tiny_store, tmp_path):
    """`evaluate --report DIR`: the page with the run's training curves and a plot per scored task; a second run
    replaces its own page; a user's page of the same name is refused without --force."""
    from typer.testing import CliRunner

    from confluence.cli.main import app
    from confluence.training.loop import open_stream, train
    from tests.fixtures.model import tiny_run_config

    cfg = tiny_run_config(loop={"max_steps": 2, "ckpt_every": 2, "val_every": 2})
    with open_stream([tiny_store], cfg) as stream:
        train(cfg, stream, tmp_path / "run", progress=False)
    args = ["evaluate", "--checkpoint", str(tmp_path / "run"), "--db", str(tiny_store), "--split", "train",
            "--draws", "1", "--no-progress", "--report", str(tmp_path / "rep")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<h2>Training curves</h2>" in page and page.count("<img") >= 2
    assert CliRunner().invoke(app, args).exit_code == 0  # its own page: replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "report.html").write_text("<html>my notes</html>")
    refused = CliRunner().invoke(app, args[:-1] + [str(tmp_path / "mine")])
    assert refused.exit_code == 1 and "not written by confluence" in refused.output
    assert (tmp_path / "mine" / "report.html").read_text() == "<html>my notes</html>"
