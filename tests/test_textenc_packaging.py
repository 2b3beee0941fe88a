"""The shipped model files are package data: a non-editable install carries them."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "confluence" / "data" / "text_encoder"


def _can_build_wheel() -> bool:
    """The venv's setuptools reads pyproject.toml (77: the SPDX `license`; it has bdist_wheel since 70.1).
    `make setup` installs one, so this skips only outside the Makefile's venv."""
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    return major >= 77


def test_package_data_config_covers_model_files():
    from setuptools import find_namespace_packages

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = cfg["packages"]["find"]
    assert find.get("namespaces", True), "confluence.data.text_encoder has no __init__.py: needs namespace finding"
    packages = find_namespace_packages(where=str(ROOT), include=find["include"])
    assert "confluence.data.text_encoder" in packages
    patterns = cfg["package-data"].get("*", []) + cfg["package-data"].get("confluence.data.text_encoder", [])
    files = sorted(p.name for p in MODEL_DIR.iterdir() if p.is_file())
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(name, pat) for pat in patterns), f"{name} is not package data"


@pytest.mark.slow
@pytest.mark.skipif(not _can_build_wheel(), reason="this setuptools is older than pyproject.toml's build backend (77)")
def test_wheel_contains_model_files(tmp_path):
    # built from a copy of the package's sources alone: a checkout's build/ and *.egg-info (left by `pip install
    # -e`) list files from earlier builds, which setuptools would package whatever pyproject.toml says
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "confluence", src / "confluence", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("confluence-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [p for p in MODEL_DIR.iterdir() if p.is_file()]
    shipped += [p for p in (ROOT / "confluence" / "pretrained").glob("*/*") if p.suffix in (".json", ".eqx")]
    shipped += list((ROOT / "confluence" / "configs").glob("*.toml"))
    assert len(shipped) > 5
    for p in shipped:
        assert p.relative_to(ROOT).as_posix() in names, f"{p.relative_to(ROOT)} is not in the wheel"
