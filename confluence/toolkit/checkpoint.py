"""Atomic checkpoints of both models: parameters, optimizer state, step and a JSON `meta` (configuration, stream
position, RNG state, ...), plus any files a checkpoint must carry to be self-contained (the text model's tokenizer).

Layout: `RUN/checkpoints/step_00000123/{state.eqx, meta.json, ...}` and `RUN/checkpoints/LATEST` (name of the
newest). A checkpoint is written into a temporary sibling directory, every file fsync'ed, then renamed into place
and the directory fsync'ed; `LATEST` is replaced atomically last. A crash at any point leaves the previous
checkpoint intact.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import numpy as np

from confluence.errors import ConfluenceError
from confluence.fsutil import fsync_path
from confluence.outputs import pid_alive, writing

STATE_FILE, META_FILE, LATEST = "state.eqx", "meta.json", "LATEST"


class CheckpointError(ConfluenceError):
    """A checkpoint is missing, incomplete or does not match the model / optimizer it is loaded into."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]


def _to_host(x):
    if isinstance(x, jax.Array):
        return np.asarray(x if x.is_fully_addressable else x.addressable_data(0))
    return x


def save_checkpoint(run_dir: Path, step: int, params, opt_state, meta: dict[str, Any], keep: int = 3,
                    files: dict[str, Path] | None = None) -> Path:
    """Write checkpoint `step` atomically, with copies of `files` (name in the checkpoint -> source path); prune
    to the newest `keep` (0: keep all). Only process 0 writes."""
    ckpt_root = Path(run_dir) / "checkpoints"
    final = ckpt_root / f"step_{step:08d}"
    host_state = jax.tree.map(_to_host, (params, opt_state))
    if jax.process_index() != 0 or (final / STATE_FILE).is_file():
        return final  # not the writer, or this step is already saved (same step, same state): never rewrite it
    with writing(final, f"checkpoint step {step}", "the previous checkpoint stands"):
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob(".tmp-step_*-*"):  # a killed writer's temporaries
            pid = stale.name.rsplit("-", 1)[1]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = ckpt_root / f".tmp-step_{step:08d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            eqx.tree_serialise_leaves(tmp / STATE_FILE, host_state)
            full_meta = {"step": step, "saved_at": time.time(), **meta}
            (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2, default=_json_default))
            for name, source in (files or {}).items():
                shutil.copyfile(source, tmp / name)
            for f in (*(tmp / n for n in (STATE_FILE, META_FILE, *(files or {}))), tmp):
                fsync_path(f)
            if final.exists():  # a leftover without its state file (never referenced by LATEST)
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        fsync_path(ckpt_root)
        latest_tmp = ckpt_root / f".{LATEST}.tmp"
        latest_tmp.write_text(final.name + "\n")
        fsync_path(latest_tmp)
        os.replace(latest_tmp, ckpt_root / LATEST)
        fsync_path(ckpt_root)
    for old in sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _json_default(obj):
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `LATEST` names in a run directory, or None when the run has none yet."""
    latest = Path(run_dir) / "checkpoints" / LATEST
    if not latest.is_file():
        return None
    cand = latest.parent / latest.read_text().strip()
    return cand if (cand / STATE_FILE).is_file() else None


def resolve_checkpoint(path: Path) -> Path:
    """A run directory (its LATEST checkpoint), a `checkpoints/` directory, a checkpoint directory, or the name of a
    shipped model, `pretrained:NAME` (`confluence.pretrained`; its files checked against its card's sha256)."""
    from confluence.pretrained import checkpoint_path, is_pretrained

    if is_pretrained(path):
        return checkpoint_path(path)
    path = Path(path)
    for root in (path / "checkpoints", path):
        latest = root / LATEST
        if latest.is_file():
            cand = root / latest.read_text().strip()
            if (cand / STATE_FILE).is_file():
                return cand
    if (path / STATE_FILE).is_file() and (path / META_FILE).is_file():
        return path
    raise CheckpointError(f"no checkpoint found at {path} (expected a run dir, its checkpoints/ or a step_* dir)")


def read_checkpoint(path: Path) -> Checkpoint:
    """The checkpoint `path` resolves to, with its meta.json; a damaged meta.json is a CheckpointError."""
    ckpt = resolve_checkpoint(path)
    try:
        meta = json.loads((ckpt / META_FILE).read_text())
        return Checkpoint(ckpt, int(meta["step"]), meta)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"checkpoint {ckpt}: its {META_FILE} is damaged or unreadable ({exc}){_earlier(ckpt)}") \
            from None


def _earlier(ckpt: Path) -> str:
    """How to go back to an earlier checkpoint of the same run, if it has one (for messages)."""
    earlier = sorted(p.name for p in ckpt.parent.glob("step_*") if p != ckpt and (p / STATE_FILE).is_file())
    if not earlier or ckpt.parent.name != "checkpoints":
        return ""
    return (f"; to continue from the previous checkpoint, write its name ({earlier[-1]}) into "
            f"{ckpt.parent / LATEST}")


def load_state(path: Path, like_params, like_opt_state=None):
    """Load (params, opt_state) shaped like the given trees; `like_opt_state=None` loads parameters only."""
    ckpt = resolve_checkpoint(path)
    try:
        if like_opt_state is None:
            params, _ = _load_params_only(ckpt, like_params)
            return params, None
        return eqx.tree_deserialise_leaves(ckpt / STATE_FILE, (like_params, like_opt_state))
    except (ValueError, RuntimeError, OSError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt}: its {STATE_FILE} cannot be read into this model / optimizer ({exc}): the file is "
            f"damaged (e.g. cut short by a full disk) or the model config differs{_earlier(ckpt)}"
        ) from exc


def _load_params_only(ckpt: Path, like_params):
    """The params are the first leaves of the file; read them and ignore the optimizer state that follows."""
    with open(ckpt / STATE_FILE, "rb") as f:
        params = eqx.tree_deserialise_leaves(f, like_params)
    return params, None
