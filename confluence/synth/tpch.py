"""TPC-H as a generated database: Parquet from `tpchgen-cli` (offline, deterministic) and its reviewed metadata
(`tpch.metadata.json`: tables, keys, stypes, a few tasks). Used by the preprocessing benchmark and as corpus
members (`confluence corpus build --tpch SF`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

from confluence.errors import ConfluenceError


def tpch_metadata_path() -> Path:
    """The reviewed metadata of TPC-H shipped in the package."""
    return Path(str(files("confluence.synth").joinpath("tpch.metadata.json")))


def tpchgen_path() -> str | None:
    """The `tpchgen-cli` executable (on PATH or beside this Python), or None when it is not installed."""
    beside = Path(sys.executable).with_name("tpchgen-cli")
    return shutil.which("tpchgen-cli") or (str(beside) if beside.is_file() else None)


def ensure_tpch(directory: Path, scale: float) -> Path:
    """Generate TPC-H Parquet at scale factor `scale` into `directory` with tpchgen-cli, unless it is there."""
    if (directory / "lineitem.parquet").is_file():
        return directory
    exe = tpchgen_path()
    if exe is None:
        raise ConfluenceError("TPC-H needs tpchgen-cli: pip install -e '.[bench]' (or pass --skip-tpch)")
    cmd = [exe, "parquet", "-s", str(scale), f"--output-dir={directory}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ConfluenceError(f"TPC-H generation failed (scale factor {scale}, exit {done.returncode}): "
                              f"{' '.join(cmd)}: {' / '.join(tail) or 'no output'}")
    return directory
