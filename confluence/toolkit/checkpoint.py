"""Atomic checkpoints of both models: parameters, optimizer state, step and a JSON `meta` (configuration, stream
position, RNG state, ...), plus any files a checkpoint must carry to be self-contained (the text model's tokenizer).

Layout: `RUN/checkpoints/step_00000123/{state.eqx, meta.json, ...}`, `RUN/checkpoints/LATEST` (name of the
newest) and, in a run that stops early on validation, `RUN/checkpoints/BEST` (name of the best-validated one, never
pruned). A checkpoint is written into a temporary sibling directory, every file fsync'ed, then renamed into place
and the directory fsync'ed; `LATEST` (and `BEST`) are replaced atomically last. A crash at any point leaves the
previous checkpoint intact. A run directory resolves to its BEST checkpoint where it has one (what evaluate,
predict and serve load) and to LATEST for resuming.
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
from confluence.toolkit.shipped import checkpoint_path, is_pretrained

STATE_FILE, META_FILE, LATEST, BEST = "state.eqx", "meta.json", "LATEST", "BEST"


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


def _point(ckpt_root: Path, name: str, final: Path) -> None:
    """Replace the pointer file `name` (LATEST / BEST) atomically with the checkpoint `final`'s name."""
    tmp = ckpt_root / f".{name}.tmp"
    tmp.write_text(final.name + "\n")
    fsync_path(tmp)
    os.replace(tmp, ckpt_root / name)
    fsync_path(ckpt_root)


def save_checkpoint(run_dir: Path, step: int, params, opt_state, meta: dict[str, Any], keep: int = 3,
                    files: dict[str, Path] | None = None, best: bool = False) -> Path:
    """Write checkpoint `step` atomically, with copies of `files` (name in the checkpoint -> source path); prune
    to the newest `keep` (0: keep all), never the one `BEST` names. `best`: this checkpoint is the run's best so
    far on validation (`BEST` names it). Only process 0 writes."""
    ckpt_root = Path(run_dir) / "checkpoints"
    final = ckpt_root / f"step_{step:08d}"
    host_state = jax.tree.map(_to_host, (params, opt_state))
    if jax.process_index() != 0:
        return final
    if (final / STATE_FILE).is_file():  # this step is already saved (same step, same state): never rewrite it
        if best:
            _point(ckpt_root, BEST, final)
        return final
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
        if best:
            _point(ckpt_root, BEST, final)
        _point(ckpt_root, LATEST, final)
    kept_best = _named(ckpt_root, BEST)
    for old in sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())[:-keep] if keep > 0 else []:
        if old != kept_best:
            shutil.rmtree(old, ignore_errors=True)
    return final


def write_params(directory: Path, params, meta: dict[str, Any]) -> None:
    """Write a parameters-only checkpoint's files into `directory` (an empty temporary directory the caller renames
    into place: a shipped model's export, an average of checkpoints): `state.eqx` holding the parameters alone
    (what `load_state` reads without an optimizer) and `meta.json`, each fsync'ed. It loads for evaluate, predict
    and serve, not for resuming."""
    directory = Path(directory)
    eqx.tree_serialise_leaves(directory / STATE_FILE, jax.tree.map(_to_host, params))
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, default=_json_default))
    for f in (directory / STATE_FILE, directory / META_FILE, directory):
        fsync_path(f)


def _named(root: Path, pointer: str) -> Path | None:
    """The complete checkpoint a pointer file (LATEST / BEST) in `root` names, or None."""
    f = root / pointer
    if not f.is_file():
        return None
    cand = root / f.read_text().strip()
    return cand if (cand / STATE_FILE).is_file() else None


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
    return _named(Path(run_dir) / "checkpoints", LATEST)


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `BEST` names in a run directory (a run with early stopping), or None."""
    return _named(Path(run_dir) / "checkpoints", BEST)


def resolve_checkpoint(path: Path, latest: bool = False) -> Path:
    """A run directory (its BEST checkpoint where early stopping kept one, else its LATEST; `latest`: always
    LATEST, as resuming needs), a `checkpoints/` directory, a checkpoint directory, or the name of a shipped model,
    `pretrained:NAME` (`confluence.toolkit.shipped`; its files checked against its card's sha256)."""
    if is_pretrained(path):
        return checkpoint_path(path)
    path = Path(path)
    for root in (path / "checkpoints", path):
        for pointer in ((LATEST,) if latest else (BEST, LATEST)):
            cand = _named(root, pointer)
            if cand is not None:
                return cand
    if (path / STATE_FILE).is_file() and (path / META_FILE).is_file():
        return path
    raise CheckpointError(f"no checkpoint found at {path} (expected a run dir, its checkpoints/ or a step_* dir)")


def read_checkpoint(path: Path, latest: bool = False) -> Checkpoint:
    """The checkpoint `path` resolves to (`resolve_checkpoint`), with its meta.json; a damaged meta.json is a
    CheckpointError."""
    ckpt = resolve_checkpoint(path, latest)
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


def load_state(path: Path, like_params, like_opt_state=None, latest: bool = False):
    """Load (params, opt_state) shaped like the given trees; `like_opt_state=None` loads parameters only."""
    ckpt = resolve_checkpoint(path, latest)
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
