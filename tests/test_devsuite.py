"""The development suite's definitions (docs/guide/devsuite.md): every member declares its source, licence and role, its
reviewed metadata parses and every task query is one the sandbox accepts; the suite has databases to tune on and
databases only to check on; `checkout` extracts a mirror that lacks some blobs; `bench quality` counts verdicts.
(Building a member needs its source, which the `fetch` tool brings outside CI.)"""

from __future__ import annotations

import subprocess

import duckdb
import pytest

from confluence.bench.quality import tally
from confluence.devsuite import MEMBERS, ROLES, checkout, member, members_with_role, metadata_path
from confluence.errors import ConfluenceError
from confluence.schema.metadata import load_metadata
from confluence.sources.raw import quote_ident
from confluence.sources.sandbox import task_query_problem


@pytest.mark.parametrize("name", MEMBERS)
def test_member_declares_its_source_and_its_tasks_pass_the_sandbox(name):
    mod = member(name)
    assert mod.ROLE in ROLES and callable(mod.build)
    src = mod.SOURCE
    assert src.get("licence") and src.get("description")
    assert ("repo" in src and len(src.get("commit", "")) >= 7) or ("package" in src and "version" in src)
    meta = load_metadata(metadata_path(name))
    assert len(meta.tasks) >= 4, f"{name}: a suite database has at least four tasks"
    kinds = {str(t.target_stype) for t in meta.tasks.values()}
    assert len(kinds) >= 3, f"{name}: tasks across the target kinds, got {kinds}"
    assert any(t.horizon for t in meta.tasks.values()), f"{name}: at least one task with a horizon"
    con = duckdb.connect()
    for table in meta.tables.values():
        cols = ", ".join(f"{quote_ident(c)} VARCHAR" for c in table.columns)
        con.execute(f"CREATE TABLE {quote_ident(table.name)} ({cols})")
    for task in meta.tasks.values():
        assert task_query_problem(con, task.query) is None, (name, task.name)


def test_the_suite_has_databases_to_tune_on_and_to_check_on():
    roles = [member(n).ROLE for n in MEMBERS]
    assert roles.count("tune") >= 2 and roles.count("check") >= 3
    assert set(members_with_role("tune")) | set(members_with_role("check")) == set(MEMBERS)
    assert members_with_role("check") == tuple(n for n in MEMBERS if member(n).ROLE == "check")
    with pytest.raises(ConfluenceError, match="no development-suite role 'train'"):
        members_with_role("train")
    assert not any("lahman" in n or "chinook" in n for n in MEMBERS)  # reserved as independent checks


def test_checkout_skips_the_blobs_a_mirror_lacks(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(work)]
    subprocess.run([*git, "init", "-q"], check=True)
    (work / "small.csv").write_text("a\n1\n")
    (work / "sub").mkdir()
    (work / "sub" / "big.csv").write_text("b\n" * 1000)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD:sub/big.csv"], capture_output=True, text=True).stdout.strip()
    (work / ".git" / "objects" / sha[:2] / sha[2:]).unlink()  # what a mirror over its size limit lacks
    out = checkout(work / ".git", "HEAD", tmp_path / "out")
    assert (out / "small.csv").read_text() == "a\n1\n" and not (out / "sub" / "big.csv").exists()
    only = checkout(work / ".git", "HEAD", tmp_path / "only", ("sub",))
    assert not (only / "small.csv").exists()


def test_quality_tally_counts_verdicts():
    def task(model, trivial, gbdt, lo, hi, not_worse):
        return {"model": {"mae": model}, "baseline": {"mae": trivial}, "gbdt": {"mae": gbdt},
                "model_vs_gbdt": {"diff": model - gbdt, "ci_low": lo, "ci_high": hi, "a_not_worse": not_worse},
                "info": {"stype": "numerical"}}
    results = {"a": task(1.0, 2.0, 1.5, -0.7, -0.3, 1.0),  # better than LightGBM (its error is lower)
               "b": task(1.6, 2.0, 1.5, -0.1, 0.3, 1.0),  # not worse
               "c": task(2.5, 2.0, 1.5, 0.8, 1.2, 0.0)}  # worse than LightGBM and than trivial
    t = tally("db", "check", results)
    assert (t.tasks, t.beats_trivial, t.not_worse_than_gbdt, t.better_than_gbdt) == (3, 2, 2, 1)
    assert t.blend_not_worse is None and t.line().count("/") == 3  # measured without a blend: no blend column
    results["c"] |= {"blend": {"mae": 1.45}, "blend_vs_gbdt": {"diff": -0.05, "ci_low": -0.1, "ci_high": 0.01,
                                                               "a_not_worse": 1.0}}
    results["b"] |= {"blend": {"mae": 1.7}, "blend_vs_gbdt": {"diff": 0.2, "ci_low": 0.1, "ci_high": 0.3,
                                                              "a_not_worse": 0.0}}
    t = tally("db", "check", results)
    assert t.blend_not_worse == 1 and t.line().count("/") == 4
    assert t.below_chance == 0
    results["d"] = {"model": {"auroc": 0.45}, "baseline": {"auroc": 0.5}, "info": {"stype": "boolean"}}
    results["e"] = {"model": {"auroc": float("nan")}, "baseline": {"auroc": 0.5}, "info": {"stype": "boolean"}}
    t = tally("db", "check", results)
    assert (t.tasks, t.beats_trivial, t.below_chance) == (5, 2, 1)  # a backwards boolean; one class: not counted
