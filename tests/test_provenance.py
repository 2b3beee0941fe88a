"""The code a run records in its checkpoints: commit, whether the package's files differ from it, a digest of the
difference that tells two working trees apart, the environment, a stamp for a copy without .git (the GPU machine's),
and null git fields (never an error) outside a checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest

import confluence
from confluence.toolkit.provenance import STAMP_ENV, code_provenance, write_stamp

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


@pytest.fixture(autouse=True)
def _no_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STAMP_ENV, raising=False)  # a stamp of the caller's shell says nothing of these checkouts


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout holding a package `confluence/` and a `docs/` folder, one commit."""
    root = tmp_path / "repo"
    (root / "confluence").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "confluence" / "a.py").write_text("x = 1\n")
    (root / "docs" / "notes.md").write_text("notes\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return root


def test_a_clean_checkout_records_its_commit(checkout: Path) -> None:
    got = code_provenance(checkout)
    assert got["commit"] == _git(checkout, "rev-parse", "HEAD")
    assert got["dirty"] is False and got["diff_sha256"] is None
    assert got["version"] == confluence.__version__
    env = got["environment"]  # what else decides a run's bits: library versions, device, CPU
    assert env["jax"] == jax.__version__ and env["numpy"] == np.__version__ and env["python"]
    assert env["backend"] == jax.default_backend() and env["device"] and env["cpu"]


def test_edits_to_the_package_are_flagged_and_told_apart(checkout: Path) -> None:
    (checkout / "docs" / "notes.md").write_text("other notes\n")  # outside the package: the code is the commit's
    assert code_provenance(checkout)["dirty"] is False
    (checkout / "confluence" / "a.py").write_text("x = 2\n")
    first = code_provenance(checkout)
    assert first["dirty"] is True and first["diff_sha256"]
    assert code_provenance(checkout)["diff_sha256"] == first["diff_sha256"]  # the same tree, the same digest
    (checkout / "confluence" / "a.py").write_text("x = 3\n")
    assert code_provenance(checkout)["diff_sha256"] != first["diff_sha256"]
    (checkout / "confluence" / "a.py").write_text("x = 1\n")
    assert code_provenance(checkout)["dirty"] is False  # back to the commit's bytes


def test_a_new_untracked_module_counts_with_its_bytes(checkout: Path) -> None:
    (checkout / "confluence" / "b.py").write_text("y = 1\n")
    one = code_provenance(checkout)
    (checkout / "confluence" / "b.py").write_text("y = 2\n")
    two = code_provenance(checkout)
    assert one["dirty"] is two["dirty"] is True and one["diff_sha256"] != two["diff_sha256"]


def test_outside_a_checkout_the_git_fields_are_null(tmp_path: Path) -> None:
    (tmp_path / "confluence").mkdir()
    got = code_provenance(tmp_path)
    assert got["commit"] is None and got["dirty"] is None and got["version"] == confluence.__version__


def test_a_package_inside_another_repository_is_not_given_its_commit(checkout: Path) -> None:
    inner = checkout / "docs"  # a folder of a repository, not its top: e.g. site-packages inside a checkout
    (inner / "confluence").mkdir()
    assert code_provenance(inner)["commit"] is None


def test_a_copy_without_git_records_the_stamp_written_in_the_checkout(checkout: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (checkout / "confluence" / "a.py").write_text("x = 2\n")
    stamp = write_stamp(tmp_path / "code_stamp.json", checkout)  # here, where git can tell
    copy = tmp_path / "copy"  # the device tool's copy: the files, no .git
    shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git"))
    assert code_provenance(copy)["commit"] is None  # without the stamp: nothing to say
    monkeypatch.setenv(STAMP_ENV, str(tmp_path / "code_stamp.json"))
    got = code_provenance(copy)
    assert got["commit"] == _git(checkout, "rev-parse", "HEAD") and got["dirty"] is True
    assert got["diff_sha256"] == code_provenance(checkout)["diff_sha256"] == stamp["diff_sha256"]
    assert got["stamped_at"] == stamp["stamped_at"]
    assert "stamped_at" not in code_provenance(checkout)  # where git can tell, git is read, not the stamp
    monkeypatch.setenv(STAMP_ENV, str(tmp_path / "missing.json"))
    with pytest.warns(UserWarning, match="missing.json: not a readable code stamp"):
        assert code_provenance(copy)["commit"] is None  # an unreadable stamp is no error, but it is said
