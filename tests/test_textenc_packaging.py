"""The shipped model files are package data: a non-editable install carries them."""

from __future__ import annotations

import fnmatch
import importlib.util
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "confluence" / "data" / "text_encoder"


def _can_build_wheel() -> bool:
    if importlib.util.find_spec("wheel") is not None:
        return True
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1)  # bdist_wheel moved into setuptools


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
@pytest.mark.skipif(not _can_build_wheel(), reason="this setuptools cannot build wheels (no bdist_wheel)")
def test_wheel_contains_model_files(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("confluence-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for p in MODEL_DIR.iterdir():
        assert f"confluence/data/text_encoder/{p.name}" in names
