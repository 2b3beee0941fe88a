"""`confluence bench quality` through the CLI on a suite folder: `--zero-shot` evaluates a shipped model as it is
beside the trivial baselines and LightGBM (nothing trained; the tally and each database's results written, read
back by a second call); a trained recipe is evaluated on its validation and test splits without training twice."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from confluence.bench.quality import run_quality
from confluence.cli.main import app
from confluence.errors import ConfluenceError


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """A suite folder whose `tpcds` member holds the small bookstore's store (preprocessed with the shipped text
    encoder, as a user's database would be): the suite's own sources are not in CI, and the bench reads a built
    store without looking at `raw/` again."""
    from confluence.preprocess.pipeline import preprocess
    from confluence.textenc import load_encoder
    from tests.fixtures.bookstore import bookstore_files

    root = tmp_path_factory.mktemp("suite")
    src, meta = bookstore_files(root / "src", size="small")
    (root / "suite" / "tpcds" / "raw").mkdir(parents=True)
    preprocess(src, meta, root / "suite" / "tpcds" / "store", encoder=load_encoder(None), progress=False)
    return root / "suite"


def test_zero_shot_bench_evaluates_a_shipped_model_on_the_validation_split(suite):
    args = ["bench", "quality", "--suite", str(suite), "--zero-shot", "pretrained:small", "--split", "val",
            "--max-seeds", "48"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pretrained:small zero-shot on the val split" in result.output and "< chance" in result.output
    assert "blend" not in result.output  # no blend measured: no blend column
    assert "not zero-shot" not in result.output  # the shipped model never saw the bookstore
    run = suite / "tpcds" / "runs" / "zeroshot-pretrained-small"
    assert not (run / "checkpoints").exists()  # nothing trained
    results = json.loads((run / "val.json").read_text())
    scored = {t: r for t, r in results.items() if "model" in r}
    assert len(scored) >= 6
    for r in scored.values():
        assert r["info"]["split"] == "val" and r["info"]["trained_on_task"] is False
        assert "gbdt" in r and "model_vs_gbdt" in r and "blend" not in r  # a blend is chosen on validation
    record = json.loads((suite / "quality-zeroshot-pretrained-small-val.json").read_text())
    assert record["written_by"] == "confluence" and record["zero_shot"] == "pretrained:small"
    assert record["recipe"] is None and record["split"] == "val"
    [tally] = record["tallies"]
    assert tally["database"] == "tpcds" and tally["tasks"] == len(scored)
    assert 0 <= tally["below_chance"] <= tally["tasks"] and tally["blend_not_worse"] is None
    before = (run / "val.json").stat().st_mtime_ns
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "evaluating" not in again.output and (run / "val.json").stat().st_mtime_ns == before


def test_the_suite_is_measured_on_validation_or_test_only(suite):
    with pytest.raises(ConfluenceError, match="'train'"):
        run_quality(suite, zero_shot="pretrained:small", split="train")


@pytest.mark.slow
def test_a_trained_run_is_read_on_both_splits_without_training_again(suite):
    args = ["bench", "quality", "--suite", str(suite), "--steps", "8", "--max-seeds", "32", "--label", "short"]
    result = CliRunner().invoke(app, args + ["--split", "val"])
    assert result.exit_code == 0, result.output
    run = suite / "tpcds" / "runs" / "short"
    assert "training small for 8 steps" in result.output and (run / "val.json").is_file()
    state = sorted((run / "checkpoints").glob("step_*/state.eqx"))
    assert state and not any("blend" in r for r in json.loads((run / "val.json").read_text()).values())
    before = [p.stat().st_mtime_ns for p in state]
    test = CliRunner().invoke(app, args)  # the test split of the same run: evaluated, with the blend, not trained
    assert test.exit_code == 0, test.output
    assert "training" not in test.output and "blend >= LightGBM" in test.output
    assert [p.stat().st_mtime_ns for p in state] == before
    assert any("blend" in r for r in json.loads((run / "test.json").read_text()).values())
    record = json.loads((suite / "quality-short.json").read_text())
    assert record["recipe"] == {"config": "small", "steps": 8} and record["zero_shot"] is None
    assert [t["database"] for t in record["tallies"]] == ["tpcds"]


@pytest.mark.parametrize("label", ["../../escape", "a/b", ".hidden", "-x"])
def test_a_label_is_a_name_inside_the_suite_never_a_path_out_of_it(suite, label):
    before = sorted(p.relative_to(suite.parent) for p in suite.parent.rglob("*"))
    result = CliRunner().invoke(app, ["bench", "quality", "--suite", str(suite), "--zero-shot", "pretrained:small",
                                      "--split", "val", "--label", label])
    assert result.exit_code != 0 and "letters, digits" in result.output, result.output
    assert sorted(p.relative_to(suite.parent) for p in suite.parent.rglob("*")) == before  # nothing written


def test_a_users_folder_where_the_results_would_go_is_refused_and_kept(suite):
    mine = suite / "tpcds" / "runs" / "mine"
    mine.mkdir(parents=True)
    (mine / "val.json").write_text("my notes")
    result = CliRunner().invoke(app, ["bench", "quality", "--suite", str(suite), "--zero-shot", "pretrained:small",
                                      "--split", "val", "--label", "mine", "--force"])
    assert result.exit_code != 0 and "was not written by confluence" in result.output, result.output
    assert (mine / "val.json").read_text() == "my notes" and sorted(p.name for p in mine.iterdir()) == ["val.json"]


@pytest.mark.parametrize("extra", [["--steps", "100"], ["--config", "demo"]])
def test_a_recipe_option_with_zero_shot_is_an_error_not_silently_ignored(suite, extra):
    before = sorted(p.relative_to(suite.parent) for p in suite.parent.rglob("*"))
    result = CliRunner().invoke(app, ["bench", "quality", "--suite", str(suite), "--zero-shot", "pretrained:small",
                                      "--split", "val", "--label", "recipe-given", *extra])
    assert result.exit_code != 0 and "nothing is trained" in result.output, result.output
    assert extra[0].lstrip("-") in result.output
    assert sorted(p.relative_to(suite.parent) for p in suite.parent.rglob("*")) == before


def test_a_users_file_where_the_tallies_would_go_is_refused_before_any_work_and_kept(suite):
    mine = suite / "quality-notes-val.json"
    mine.write_text("my notes")
    result = CliRunner().invoke(app, ["bench", "quality", "--suite", str(suite), "--zero-shot", "pretrained:small",
                                      "--split", "val", "--label", "notes", "--force"])
    assert result.exit_code != 0 and "not written by confluence" in result.output, result.output
    assert mine.read_text() == "my notes" and not (suite / "tpcds" / "runs" / "notes").exists()
    mine.unlink()


def test_a_label_measured_by_another_process_is_refused_at_once(suite):
    from confluence.outputs import OutputLock

    lock = OutputLock(suite / "quality-busy-val.json", "measured (bench quality)").acquire()  # another writer
    try:
        result = CliRunner().invoke(app, ["bench", "quality", "--suite", str(suite), "--zero-shot",
                                          "pretrained:small", "--split", "val", "--label", "busy"])
    finally:
        lock.release()
    assert result.exit_code != 0 and "by another process" in result.output, result.output
    assert not (suite / "tpcds" / "runs" / "busy").exists() and not (suite / "quality-busy-val.json").exists()
