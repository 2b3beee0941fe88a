"""JAX's persistent compilation cache, shared by every command that runs a model (predict, evaluate, serve):
a second run loads the compiled model from disk instead of compiling it again."""

from __future__ import annotations

import os
from pathlib import Path

import jax

# CONFLUENCE_COMPILE_CACHE names another folder, or "off"
DEFAULT_COMPILE_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "confluence" / "jax"


def default_compile_cache() -> str:
    """The cache folder a command uses unless told otherwise: `CONFLUENCE_COMPILE_CACHE`, else `DEFAULT_COMPILE_CACHE`."""
    return os.environ.get("CONFLUENCE_COMPILE_CACHE") or str(DEFAULT_COMPILE_CACHE)


def use_compile_cache(directory: str | None = None) -> Path | None:
    """Turn on JAX's persistent compilation cache in `directory` (None: `default_compile_cache()`; "off": leave it
    off), so a restarted command or server loads its compiled shapes instead of compiling them again. A folder that
    cannot be created leaves the cache off (compiling is slower, never wrong)."""
    directory = default_compile_cache() if directory is None else directory
    if directory == "off":
        return None
    path = Path(directory).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
