"""Pretraining corpora (`confluence corpus build`): the same spec writes the same bytes whatever the number of workers
or of runs, a killed or partly deleted corpus is finished by rebuilding only what is missing, another spec in the
same directory is refused naming the differing fields, the held-out choice is recorded and stable as the corpus
grows, and `open_corpus` hands the training run its train and held-out stores."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.corpus import Corpus, CorpusError, build_corpus, open_corpus
from confluence.corpus import build as corpus_build
from confluence.corpus.spec import CORPUS_FILE, is_heldout
from confluence.outputs import OutputError
from confluence.store import Store
from tests.fixtures.bookstore import HashEncoder, bookstore_metadata, write_bookstore, write_metadata
from tests.fixtures.configs import seed_sampler

ROWS = 0.05  # tiny databases: about 1-1,600 rows each
N = 3


def _digests(root: Path) -> dict[str, str]:
    """sha256 of every file under `root`, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _build(out: Path, databases: int = N, **kw) -> Corpus:
    return build_corpus(out, databases, rows=ROWS, encoder=HashEncoder(8), progress=False, **kw)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A corpus of N tiny databases built once with one worker, and the digests of all its files."""
    out = tmp_path_factory.mktemp("corpus") / "ref"
    corpus = _build(out)
    assert corpus.built == ("db_00000", "db_00001", "db_00002") and corpus.skipped == ()
    return out, _digests(out)


def _copy(reference: tuple[Path, dict[str, str]], tmp_path: Path) -> Path:
    out = tmp_path / "corpus"
    shutil.copytree(reference[0], out)
    return out


def test_layout_and_open_corpus(reference):
    out, digests = reference
    assert {"corpus.json"} | {f"stores/db_0000{i}/metadata.json" for i in range(N)} <= set(digests)
    assert all(f"raw/db_0000{i}/random.metadata.json" in digests for i in range(N))
    corpus = open_corpus(out)
    assert corpus.train_stores == [out / "stores" / "db_00000", out / "stores" / "db_00002"]
    assert corpus.heldout_stores == [out / "stores" / "db_00001"]
    assert [m.seed for m in corpus.members] == [0, 1, 2]
    for store in corpus.train_stores + corpus.heldout_stores:
        s = Store.open(store)
        assert s.num_rows > 0 and s.tasks and s.d_t == 8
    recorded = json.loads((out / CORPUS_FILE).read_text())
    assert recorded["spec"] == {"seed": 0, "databases": N, "rows": ROWS, "heldout": 0.1, "tpch": [],
                                "encoder": {"kind": "hash", "fingerprint": "hash-8", "dim": 8}, "extra": []}
    assert [(m["name"], m["role"]) for m in recorded["members"]] == [
        ("db_00000", "train"), ("db_00001", "heldout"), ("db_00002", "train")]


def test_deterministic_same_bytes_and_a_complete_run_skips_all(reference, tmp_path):
    again = _build(tmp_path / "again")
    assert _digests(tmp_path / "again") == reference[1]
    assert again.built == ("db_00000", "db_00001", "db_00002")
    rerun = _build(tmp_path / "again")
    assert rerun.built == () and rerun.skipped == ("db_00000", "db_00001", "db_00002")
    assert _digests(tmp_path / "again") == reference[1]


def test_two_workers_write_the_same_bytes(reference, tmp_path):
    parallel = _build(tmp_path / "parallel", workers=2)
    assert parallel.built == ("db_00000", "db_00001", "db_00002")
    assert _digests(tmp_path / "parallel") == reference[1]


def test_resume_rebuilds_only_the_missing_or_half_written_member(reference, tmp_path):
    out = _copy(reference, tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs: what a killed build leaves behind
    for path in (out / "stores" / "db_00001", out / "raw" / "db_00001"):
        shutil.rmtree(path)
    for half in (out / "stores" / f"db_00001.tmp-{dead.pid}", out / "raw" / f".tmp-db_00001-{dead.pid}"):
        half.mkdir()
        (half / "metadata.json").write_bytes(b"half-written")
    with pytest.raises(CorpusError, match=r"1 of 3 member store\(s\) not built \(db_00001\)"):
        open_corpus(out)  # never loads a corpus with a missing store
    resumed = _build(out)
    assert resumed.built == ("db_00001",) and resumed.skipped == ("db_00000", "db_00002")
    assert _digests(out) == reference[1]  # leftovers removed, db_00001 written again, the same bytes
    shutil.rmtree(out / "raw")  # raw databases may be deleted once their stores are complete
    assert _build(out).built == () and open_corpus(out).train_stores


@pytest.mark.slow
def test_a_killed_build_is_finished_by_the_next(reference, tmp_path):
    out = tmp_path / "killed"
    code = (f"from confluence.corpus import build_corpus\nfrom tests.fixtures.bookstore import HashEncoder\n"
            f"build_corpus({str(out)!r}, {N}, rows={ROWS}, encoder=HashEncoder(8), progress=False)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parent.parent)
    deadline = time.monotonic() + 120
    while not (out / "stores" / "db_00000" / "metadata.json").is_file() and proc.poll() is None:
        assert time.monotonic() < deadline, "the build wrote no store in 120 s"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # somewhere in db_00001's generation or preprocessing
    assert proc.wait() == -signal.SIGKILL, "the build ended before it was killed"
    resumed = _build(out)
    assert "db_00000" in resumed.skipped and resumed.built
    assert _digests(out) == reference[1]


def test_another_spec_is_refused_naming_the_fields(reference, tmp_path):
    out = _copy(reference, tmp_path)
    with pytest.raises(CorpusError, match=r"seed: 0 recorded, 5 asked; rows: 0.05 recorded, 0.1 asked"):
        build_corpus(out, N, seed=5, rows=0.1, encoder=HashEncoder(8), progress=False)
    with pytest.raises(CorpusError, match=r"encoder: .*hash-8.*hash-16"):
        build_corpus(out, N, rows=ROWS, encoder=HashEncoder(16), progress=False)
    with pytest.raises(CorpusError, match="databases: 3 recorded, 2 asked"):
        _build(out, 2)
    assert _digests(out) == reference[1]  # nothing touched
    other = _build(out, 1, seed=7, overwrite=True)
    assert other.built == ("db_00000",) and open_corpus(out).members[0].seed == 7
    assert sorted(p.name for p in (out / "stores").iterdir()) == ["db_00000"]


def test_growing_keeps_roles_and_builds_only_the_new_members(reference, tmp_path):
    out = _copy(reference, tmp_path)
    grown = _build(out, 4)
    assert grown.skipped == ("db_00000", "db_00001", "db_00002") and grown.built == ("db_00003",)
    members = json.loads((out / CORPUS_FILE).read_text())["members"]
    assert members[:N] == json.loads((reference[0] / CORPUS_FILE).read_text())["members"]
    assert members[N] == {"name": "db_00003", "kind": "random", "role": "train", "seed": 3}
    after = _digests(out)
    assert {k: v for k, v in after.items() if k in reference[1] and k != CORPUS_FILE} == {
        k: v for k, v in reference[1].items() if k != CORPUS_FILE}


@pytest.mark.parametrize("heldout", [0.05, 0.1, 0.2, 0.25, 0.3, 0.5])
def test_heldout_share_is_even_and_at_least_one(heldout):
    for n in range(2, 200):
        count = sum(is_heldout(i, heldout) for i in range(n))
        assert count >= 1 and abs(count - heldout * n) <= 1, (n, count)
    assert not any(is_heldout(i, 0.0) for i in range(50))


def test_a_failed_member_is_named_and_the_others_kept(tmp_path):
    out = tmp_path / "failing"
    out.mkdir()
    _build(out, 1)  # a corpus of one, then grown over a foreign raw/db_00001
    (out / "raw" / "db_00001" / "raw").mkdir(parents=True)
    (out / "raw" / "db_00001" / "spec.json").write_text(json.dumps({"spec": {"seed": 99}}))
    with pytest.raises(CorpusError) as err:
        _build(out, 3)
    assert "1 of 2 member(s) failed" in str(err.value) and "db_00001 (seed 1)" in str(err.value)
    assert "another spec (" in str(err.value) and "seed 99 there, 1 here" in str(err.value)
    assert [m.name for m in open_corpus(out, require_complete=False).incomplete] == ["db_00001"]
    assert (out / "stores" / "db_00002" / "metadata.json").is_file()


def test_a_member_of_an_earlier_generator_is_refused_naming_what_changed(tmp_path):
    """A raw member written before link signals existed (its spec.json lacks `link_signal`): the error names it."""
    import dataclasses

    from confluence.synth.random_db import RandomSpec

    out = tmp_path / "old"
    out.mkdir()
    _build(out, 1)
    old = dataclasses.asdict(RandomSpec(seed=1, rows=ROWS))
    del old["link_signal"]
    (out / "raw" / "db_00001" / "raw").mkdir(parents=True)
    (out / "raw" / "db_00001" / "spec.json").write_text(json.dumps({"spec": old}))
    with pytest.raises(CorpusError, match="link_signal 'unset' there, 0.7 here"):
        _build(out, 2)


@pytest.mark.parametrize("spec_json, message", [
    ('{"spec": [1, 2]}', "its spec is a list, not an object"),
    ('[1, 2]', "not a random database written by the corpus"),
    ('{"nope": 1}', "not a random database written by the corpus"),
    (json.dumps({"spec": {f"junk{i}": "x" * 500 for i in range(100)}}), "more; written by an earlier generator"),
])
def test_a_hostile_member_spec_is_a_named_error(tmp_path, spec_json, message):
    """A member's spec.json is a file on disk anyone may have written: any shape is a short, named error."""
    out = tmp_path / "hostile"
    out.mkdir()
    _build(out, 1)
    (out / "raw" / "db_00001" / "raw").mkdir(parents=True)
    (out / "raw" / "db_00001" / "spec.json").write_text(spec_json)
    with pytest.raises(CorpusError, match=message) as err:
        _build(out, 2)
    assert "db_00001" in str(err.value) and len(str(err.value)) < 2000


@pytest.mark.parametrize("kw,message", [
    ({"databases": 0}, "databases must be an integer in 1..100000, got 0"),
    ({"heldout": 0.9}, "heldout must be a share in"),
    ({"rows": 0.0}, "rows must be a number in"),
    ({"workers": 0}, "workers must be an integer >= 1"),
    ({"tpch": [0.01, 0.01]}, "tpch scale factors must differ"),
])
def test_bad_arguments_are_clear_errors(tmp_path, kw, message):
    args = {"databases": 2, **kw}
    with pytest.raises(CorpusError, match=message):
        build_corpus(tmp_path / "bad", args.pop("databases"), encoder=HashEncoder(8), progress=False, **args)
    assert not (tmp_path / "bad").exists()


def test_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match="it holds 'notes.txt'\\) and was not written by confluence"):
        _build(tmp_path, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_cli_build_show_and_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_build, "load_encoder", lambda spec: HashEncoder(8))
    out = tmp_path / "cli"
    args = ["corpus", "build", "--out", str(out), "--databases", "2", "--rows", str(ROWS), "--no-progress"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "built 2, skipped 0" in first.output and "1 train store(s), 1 held-out" in first.output
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "built 0, skipped 2" in again.output, again.output
    show = CliRunner().invoke(app, ["corpus", "show", str(out)])
    assert show.exit_code == 0, show.output
    lines = {line.split()[0]: line.split() for line in show.output.splitlines() if line.startswith("db_")}
    store = Store.open(out / "stores" / "db_00001")
    assert lines["db_00001"] == ["db_00001", "heldout", str(len(store.tables)), str(store.num_rows),
                                 str(len(store.tasks)), str(len(store.link_tasks))]
    links = sum(len(Store.open(out / "stores" / m).link_tasks) for m in ("db_00000", "db_00001"))
    assert lines["db_00000"][1] == "train" and "2 of 2 member(s) built" in show.output
    assert f"; {links} link task(s) in" in show.output
    for bad, message in ((["--databases", "0"], "databases must be an integer"),
                         (["--rows", "0.1"], "rows: 0.05 recorded, 0.1 asked")):
        res = CliRunner().invoke(app, [*args, *bad])
        assert res.exit_code == 1 and "error: " in res.output and message in res.output, res.output
    usage = CliRunner().invoke(app, ["corpus", "build", "--out", str(out), "--databases", "many"])
    assert usage.exit_code == 2
    missing = CliRunner().invoke(app, ["corpus", "show", str(tmp_path / "nothing")])
    assert missing.exit_code == 1 and "not a corpus" in missing.output


def test_tpch_needs_tpchgen_cli(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_build, "tpchgen_path", lambda: None)
    with pytest.raises(CorpusError, match=r"--tpch needs tpchgen-cli .*pip install tpchgen-cli"):
        _build(tmp_path / "t", 1, tpch=[0.01])
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
@pytest.mark.skipif(corpus_build.tpchgen_path() is None, reason="tpchgen-cli (the 'bench' extra) is not installed")
def test_tpch_members_are_train_and_resumable(tmp_path):
    out = tmp_path / "tpch"
    corpus = _build(out, 2, tpch=[0.01])
    assert corpus.built == ("db_00000", "db_00001", "tpch_sf0.01")
    assert corpus.train_stores == [out / "stores" / "db_00000", out / "stores" / "tpch_sf0.01"]
    store = Store.open(out / "stores" / "tpch_sf0.01")
    assert {t.name for t in store.tables} >= {"lineitem", "orders", "customer"} and store.num_rows > 80_000
    # pretraining reads 8 labelled rows per context (`pretrain-small`): every derived task must say when its
    # labels become known; the TPC-H next-90-days count once did not, and the first pretraining run over it stopped
    from confluence.sampler import Sampler
    from confluence.sampler.labels import task_horizon
    from confluence.stypes import US_PER_DAY

    tasks = store.meta["database"]["tasks"]
    assert {n: task_horizon(store, n) for n in tasks}["customer_orders_next_90d"] == 90 * US_PER_DAY
    cfg = seed_sampler(batch_size=4, seq_len=128, labels=8, prefetch=0)
    with Sampler([store], cfg, seed=0) as sampler:
        for name in tasks:
            e = sampler.entry(name)
            assert sampler.build(name, np.arange(min(4, len(e.task.obs_time))), context="train") is not None
    before = _digests(out)
    shutil.rmtree(out / "stores" / "tpch_sf0.01")
    again = _build(out, 2, tpch=[0.01])
    assert again.built == ("tpch_sf0.01",) and _digests(out) == before


def test_a_failing_tpch_generation_is_a_clear_error(tmp_path):
    from confluence.errors import ConfluenceError
    from confluence.synth.tpch import ensure_tpch, tpchgen_path

    if tpchgen_path() is None:
        pytest.skip("tpchgen-cli is not installed")
    with pytest.raises(ConfluenceError, match=r"TPC-H generation failed \(scale factor -1.0, exit \d+\)"):
        ensure_tpch(tmp_path / "tpch", -1.0)


def test_a_database_of_your_own_is_a_train_member_and_resumable(reference, tmp_path):
    """`--database METADATA=SOURCE`: preprocessed from its source into stores/<its name>, trained on, recorded
    with its metadata's digest; a rebuild skips it; a changed metadata file is another spec, refused by name."""
    source = write_bookstore(tmp_path / "raw")
    meta = write_metadata(tmp_path)
    out = _copy(reference, tmp_path)
    corpus = _build(out, extra=[(meta, source)])
    assert corpus.built == ("bookstore",) and len(corpus.skipped) == N
    assert corpus.train_stores[-1] == out / "stores" / "bookstore"
    store = Store.open(out / "stores" / "bookstore")
    assert store.num_rows > 0 and {t.name for t in store.tasks} == set(bookstore_metadata()["tasks"])
    recorded = json.loads((out / CORPUS_FILE).read_text())
    assert recorded["members"][-1] == {"name": "bookstore", "kind": "database", "role": "train",
                                       "source": str(source), "metadata": str(meta)}
    assert recorded["spec"]["extra"][0]["sha256"] == hashlib.sha256(meta.read_bytes()).hexdigest()
    assert open_corpus(out).members[-1].kind == "database"
    assert _build(out, extra=[(meta, source)]).built == ()
    # the reference corpus's other members are untouched
    assert {k: v for k, v in _digests(out).items() if k.startswith("stores/db_")} == {
        k: v for k, v in reference[1].items() if k.startswith("stores/db_")}
    changed = bookstore_metadata()
    changed["description"] = "edited"
    with pytest.raises(CorpusError, match=r"databases of your own: \['bookstore'\] recorded.*metadata file changed"):
        _build(out, extra=[(write_metadata(tmp_path / "edited", changed), source)])


def test_databases_of_your_own_are_checked_before_anything_is_written(tmp_path):
    source = write_bookstore(tmp_path / "raw")
    meta = write_metadata(tmp_path)
    from confluence import devsuite

    cases = [
        ([(meta, source), (meta, source)], "two databases of your own are both named 'bookstore'"),
        ([(tmp_path / "none.json", source)], "none.json: .*cannot read the metadata file"),
        ([(write_metadata(tmp_path / "n", {"tables": {}}), source)], "(?s)bookstore.metadata.json: 2 problem.*missing required field 'name'"),
        ([(write_metadata(tmp_path / "d", {**bookstore_metadata(), "name": "db_7"}), source)],
         "not with db_ or tpch_"),
        ([(devsuite.metadata_path("euip"), source)], "'euip' is a check database of the development suite"),
    ]
    for extra, message in cases:
        with pytest.raises(CorpusError, match=message):
            _build(tmp_path / "c", 1, extra=extra)
        assert not (tmp_path / "c").exists()
    # a check database's metadata copied elsewhere is still refused: its bytes give it away
    exact = tmp_path / "copy.metadata.json"
    exact.write_bytes(devsuite.metadata_path("intl_football").read_bytes())
    with pytest.raises(CorpusError, match="'intl_football' is a check database"):
        _build(tmp_path / "c", 1, extra=[(exact, source)])


def test_cli_database_option(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_build, "load_encoder", lambda spec: HashEncoder(8))
    source = write_bookstore(tmp_path / "raw")
    meta = write_metadata(tmp_path)
    out = tmp_path / "cli"
    args = ["corpus", "build", "--out", str(out), "--databases", "1", "--rows", str(ROWS), "--no-progress"]
    res = CliRunner().invoke(app, [*args, "--database", f"{meta}={source}"])
    assert res.exit_code == 0 and "built 2, skipped 0" in res.output, res.output
    show = CliRunner().invoke(app, ["corpus", "show", str(out)])
    assert "1 database(s) of your own" in show.output and any(
        line.split()[:2] == ["bookstore", "train"] for line in show.output.splitlines()), show.output
    bad = CliRunner().invoke(app, [*args, "--database", str(meta)])
    assert bad.exit_code == 1 and "expected METADATA=SOURCE" in bad.output, bad.output


def test_a_tampered_corpus_file_cannot_point_a_store_outside_the_corpus(reference, tmp_path):
    """corpus.json is read back on every build and training run: a database of one's own named `../x` there is
    refused before any path is made from it."""
    out = _copy(reference, tmp_path)
    obj = json.loads((out / CORPUS_FILE).read_text())
    obj["spec"]["extra"] = [{"name": "../escaped", "source": "/nowhere", "metadata": "m.json", "sha256": "0" * 64}]
    (out / CORPUS_FILE).write_text(json.dumps(obj))
    with pytest.raises(CorpusError, match="member name '../escaped' must be"):
        open_corpus(out)
    with pytest.raises(CorpusError, match="member name '../escaped' must be"):
        _build(out)
    assert not (tmp_path / "escaped").exists() and not (out / "escaped").exists()
