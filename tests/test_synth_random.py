"""Random databases (`confluence synth random`): deterministic bytes, distinct schemas per seed, and over many seeds
valid metadata, a preprocessable database and a batch for every task, with the generator's invariants checked on
the written data (foreign keys resolve or are counted dangling, self-references are acyclic, children come after
their temporal parents, all seven semantic types occur)."""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.errors import ConfigError, ConfluenceError
from confluence.preprocess.pipeline import preprocess
from confluence.sampler.sampler import Sampler
from confluence.schema.metadata import parse_horizon
from confluence.schema.validate import load_and_validate
from confluence.sources import open_source
from confluence.store import Store
from confluence.stypes import SemanticType
from confluence.synth.random_db import TOPOLOGIES, RandomSpec, generate_random, write_random
from tests.fixtures.configs import seed_sampler

CONFIG = seed_sampler(batch_size=4, seq_len=96, max_rows=24, row_buckets=(24,), text_buckets=(64,))


@pytest.fixture(scope="module")
def encoder():
    from confluence.textenc.default import StaticEncoder

    return StaticEncoder()


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _schema(meta: dict) -> dict:
    return {t: {c: v["stype"] for c, v in tm["columns"].items()} for t, tm in meta["tables"].items()}


def test_same_seed_same_bytes_other_seeds_other_schemas(tmp_path):
    spec = RandomSpec(seed=7, rows=0.2)
    a, b = write_random(tmp_path / "a", spec), write_random(tmp_path / "b", spec)
    assert _digests(a) == _digests(b)
    assert any(k.startswith("raw/") and k.endswith(".parquet") for k in _digests(a))
    schemas = [json.dumps(_schema(generate_random(RandomSpec(seed=s, rows=0.05)).metadata), sort_keys=True)
               for s in range(8)]
    assert len(set(schemas)) == len(schemas)
    with pytest.raises(ConfluenceError, match="already exists"):
        write_random(a, spec)
    assert _digests(a) == _digests(b)


@pytest.mark.parametrize(("setting", "kwargs"), [
    ("topology", {"topology": "ring"}), ("tables", {"tables": 0}), ("rows", {"rows": 0.0}),
    ("min_tables", {"min_tables": 9, "max_tables": 3}), ("dangling", {"dangling": 0.9}), ("seed", {"seed": -1}),
    ("fanout", {"fanout": "pareto"}), ("self_reference", {"self_reference": 1.5}),
])
def test_a_bad_setting_is_a_config_error_naming_it(setting, kwargs):
    with pytest.raises(ConfigError) as exc:
        RandomSpec(**kwargs)
    assert exc.value.setting == setting


def _read(root: Path) -> tuple[dict, dict, dict]:
    meta = json.loads((root / "random.metadata.json").read_text())
    drawn = json.loads((root / "spec.json").read_text())
    tables = {t: pq.read_table(root / "raw" / f"{t}.parquet").to_pydict() for t in meta["tables"]}
    return meta, drawn, tables


def _acyclic(parent: np.ndarray) -> bool:
    """A functional graph (row -> parent row, -1 for none) has no cycle: every row's 2^k-th ancestor is none."""
    n = len(parent)
    jump = np.where(parent >= 0, parent, n)
    jump = np.append(jump, n)  # n: "no parent", its own parent
    for _ in range(max(1, int(np.ceil(np.log2(n + 1)))) + 1):
        jump = jump[jump]
    return bool((jump[:n] == n).all())


def check_invariants(root: Path) -> None:
    """What the generator promises, checked on the written files."""
    meta, drawn, tables = _read(root)
    stypes = {c["stype"] for t in meta["tables"].values() for c in t["columns"].values()}
    assert stypes == {s.label for s in SemanticType}  # all seven
    for fk in drawn["foreign_keys"]:
        child, parent = meta["tables"][fk["table"]], meta["tables"][fk["parent"]]
        keys = tables[fk["parent"]][parent["primary_key"]]
        index = {k: i for i, k in enumerate(keys)}
        values = tables[fk["table"]][fk["column"]]
        assert sum(v is None for v in values) == fk["nulls"]
        assert sum(v is not None and v not in index for v in values) == fk["dangling"]
        rows = np.array([index.get(v, -1) if v is not None else -1 for v in values])
        if fk["self_reference"]:
            assert fk["dangling"] == 0 and _acyclic(rows)
        ct, pt = child.get("temporal_column"), parent.get("temporal_column")
        if ct and pt:  # a child comes after its temporal parent
            ctime, ptime = tables[fk["table"]][ct], tables[fk["parent"]][pt]
            assert all(ctime[i] > ptime[r] for i, r in enumerate(rows) if r >= 0)
    kinds = list(drawn["tasks"].values())
    assert "cell" in kinds
    temporal_child = any(meta["tables"][fk["table"]].get("temporal_column") for fk in drawn["foreign_keys"])
    if temporal_child:
        assert "derived" in kinds
    for name, kind in drawn["tasks"].items():  # derived tasks say when their label is known (labelled context)
        if kind == "derived":
            ahead = "obs_time + INTERVAL" in meta["tasks"][name]["query"]  # its query reads rows after obs_time
            assert (parse_horizon(meta["tasks"][name]["horizon"]) > 0) == ahead, name


def preprocess_and_sample(root: Path, out: Path, encoder) -> Store:
    store = Store.open(preprocess(root / "raw", root / "random.metadata.json", out, encoder=encoder, progress=False))
    meta, drawn, _ = _read(root)
    assert {t.name for t in store.tasks} == set(meta["tasks"])
    assert {t.name for t in store.link_tasks} == set(meta.get("link_tasks", {}))
    for fk in drawn["foreign_keys"]:  # preprocessing counts exactly the dangling keys the generator planted
        assert store.meta["graph"]["dangling"].get(f"{fk['table']}.{fk['column']}", 0) == fk["dangling"]
    sampler = Sampler([store], CONFIG)
    labelled = Sampler([store], replace(CONFIG, labels=3))  # every task can show labelled rows
    for info in store.tasks:
        labelled.build(info.name, np.arange(min(4, info.num_seeds))).batch.validate()
        assert info.num_seeds > 0, info.name
        ids = np.arange(min(4, info.num_seeds))
        res = sampler.build(info.name, ids)
        res.batch.validate()
        assert (res.batch.is_target.sum(axis=1) == 1).all()
        for i in range(len(ids)):  # no context row after the observation time
            rows = res.rows[i, 1: res.nrows[i]]
            assert (store.row_time[rows] <= res.batch.obs_times[i]).all()
    return store


@pytest.mark.parametrize(("topology", "seed"), [(t, s) for s, t in enumerate(TOPOLOGIES)])
def test_each_topology_validates_preprocesses_and_samples(topology, seed, tmp_path, encoder):
    root = write_random(tmp_path / "db", RandomSpec(seed=seed, topology=topology, rows=0.3, temporal=0.7,
                                                    self_reference=0.5))
    meta, drawn, _ = _read(root)
    assert drawn["topology"] == topology
    with open_source(root / "raw") as raw:
        load_and_validate(root / "random.metadata.json", raw)
    check_invariants(root)
    n = len(meta["tables"])
    fks = [(f["table"], f["parent"]) for f in drawn["foreign_keys"] if not f["self_reference"]]
    names = list(meta["tables"])  # in drawing order: parents first
    if topology == "chain":
        assert fks == [(names[i], names[i - 1]) for i in range(1, n)]
    elif topology == "star":
        assert sorted(fks) == sorted((names[-1], p) for p in names[:-1])
    elif topology == "snowflake" and n > 3:  # a tree: the fact table -> dimensions -> sub-dimensions
        assert sorted(p for _, p in fks) == sorted(names[:-1])
        assert sum(c == names[-1] for c, _ in fks) >= 2
    preprocess_and_sample(root, tmp_path / "store", encoder)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([0.02, 0.05, 0.1]))
def test_random_databases_never_break_preprocessing_or_sampling(seed, rows, encoder):
    with tempfile.TemporaryDirectory() as d:
        root = write_random(Path(d) / "db", RandomSpec(seed=seed, rows=rows))
        check_invariants(root)
        preprocess_and_sample(root, Path(d) / "store", encoder)


def test_cli_count_writes_resumes_and_refuses_another_spec(tmp_path):
    out = tmp_path / "corpus"
    args = ["synth", "random", "--out", str(out), "--seed", "11", "--rows", "0.05"]
    first = CliRunner().invoke(app, [*args, "--count", "2"])
    assert first.exit_code == 0, first.output
    assert sorted(p.name for p in out.iterdir()) == ["db_00000", "db_00001"]
    before = {p.name: _digests(p) for p in out.iterdir()}
    assert json.loads((out / "db_00001" / "spec.json").read_text())["spec"]["seed"] == 12
    again = CliRunner().invoke(app, [*args, "--count", "3"])  # resumes: the two complete ones are skipped
    assert again.exit_code == 0, again.output
    assert "wrote 1 " in again.output and "2 already complete" in again.output
    assert {p.name: _digests(p) for p in out.iterdir() if p.name != "db_00002"} == before
    single = write_random(tmp_path / "single", RandomSpec(seed=13, rows=0.05))
    assert _digests(single) == _digests(out / "db_00002")  # db_i is seed + i
    other = CliRunner().invoke(app, ["synth", "random", "--out", str(out), "--seed", "99", "--rows", "0.05",
                                     "--count", "2"])
    assert other.exit_code == 1 and "another spec" in other.output
    assert {p.name: _digests(p) for p in out.iterdir() if p.name != "db_00002"} == before


def test_cli_single_database_and_clear_errors(tmp_path):
    out = tmp_path / "db"
    ok = CliRunner().invoke(app, ["synth", "random", "--out", str(out), "--tables", "3", "--topology", "chain",
                                  "--rows", "0.1"])
    assert ok.exit_code == 0, ok.output
    assert "chain, 3 tables" in ok.output and (out / "random.metadata.json").is_file()
    for bad, word in ((["--topology", "ring"], "topology"), (["--tables", "0"], "tables"),
                      (["--rows", "0"], "rows"), (["--count", "0"], "--count")):
        result = CliRunner().invoke(app, ["synth", "random", "--out", str(tmp_path / "x"), *bad])
        assert result.exit_code == 1 and "error:" in result.output and word in result.output, result.output
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
        assert "Traceback" not in result.output
    again = CliRunner().invoke(app, ["synth", "random", "--out", str(out)])
    assert again.exit_code == 1 and "already exists" in again.output


def test_a_when_next_task_is_added_without_moving_anything_else():
    """A "when is the next one" task: its target is the parent's first child row after the observation time within
    the horizon (NULL: none), for the parents with a child row in the horizon before it; it comes from a generator
    of its own, so the tables and the other tasks are those drawn before it existed (the digest below was computed
    with the generator of commit 1f216bb; without link signals, which the link tasks brought later)."""
    import duckdb

    db = generate_random(RandomSpec(seed=1001, rows=0.2, link_signal=0.0))
    names = [k for k in db.metadata["tasks"] if "_next_at" in k]
    assert names == ["team_exams_next_at"]
    task = db.metadata["tasks"][names[0]]
    assert task["target_stype"] == "timestamp" and task["observation_time_column"] == "obs_time"
    window = int(task["horizon"].split()[0])
    h = hashlib.sha256()
    for name, t in db.tables.items():
        for c in t.column_names:
            h.update(name.encode() + c.encode() + repr(t.column(c).to_pylist()).encode())
    h.update(json.dumps({k: v for k, v in db.metadata["tasks"].items() if k not in names}, sort_keys=True).encode())
    assert h.hexdigest() == "eb3892f74d3e10690eb3f47fdee7ed4372936815e6b233723d3c91b193293b22"
    # the target recomputed with numpy from the child table
    child = db.tables["exams"]
    fk = next(c for c in child.column_names if db.metadata["tables"]["exams"]["columns"][c].get("foreign_key", "")
              .startswith(f"{task['anchor_table']}."))
    time_col = db.metadata["tables"]["exams"]["temporal_column"]
    owner = np.array([-1 if v is None else v for v in child.column(fk).to_pylist()])
    at = np.array(child.column(time_col).to_pylist(), dtype="datetime64[us]")
    con = duckdb.connect()
    for n, t in db.tables.items():
        con.register(n, t)
    rows = con.sql(task["query"]).fetchall()
    assert len(rows) >= 20 and sum(r[2] is not None for r in rows) >= 20
    w = np.timedelta64(window, "D")
    for anchor, obs, target in rows[:: max(1, len(rows) // 200)]:
        obs = np.datetime64(obs, "us")
        mine = owner == anchor
        assert (mine & (at <= obs) & (at > obs - w)).any()  # a parent recently active
        ahead = at[mine & (at > obs) & (at <= obs + w)]
        assert target == (None if ahead.size == 0 else ahead.min().astype(object))
