"""Pretrained checkpoints shipped inside the package, loadable by name: `--checkpoint pretrained:small`,
`--init-from pretrained:small` (docs/guide/pretrained.md, the model card).

A shipped model is a directory `confluence/pretrained/<name>/` holding a checkpoint's parameters (`state.eqx`,
without optimizer state: a fine-tuning run starts its own), its `meta.json` (training config, step, databases) and
`card.json`: how it was made (corpus, steps, hardware, wall time, command) and the sha256 of each file, checked
every time the model is loaded, so a damaged or swapped file is an error, never a silently different model.
Resolving and checking a name is `confluence.toolkit.shipped` (below every loader); `export_pretrained` makes one
from a run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from confluence import outputs
from confluence.errors import ConfluenceError
from confluence.toolkit.shipped import (
    CARD,
    MAX_BYTES,
    PREFIX,
    ROOT,
    SHIPPED_FILES,
    _verified,
    available,
    card,
    checkpoint_path,
    is_model_dir,
    is_pretrained,
    sha256,
)


def export_pretrained(run: Path, name: str, info: dict[str, Any], root: Path | None = None,
                      overwrite: bool = False) -> Path:
    """Ship the latest checkpoint of `run` as `pretrained:<name>` under `root`: its parameters only (no optimizer
    state), its meta.json and a card with `info` (corpus, hardware, wall time, command, results), the code that
    trained it and the files' sha256. Written to a temporary directory and renamed, so a half-written model never
    loads; an existing one is replaced only with `overwrite`."""
    import equinox as eqx

    from confluence.model.transformer import load_transformer
    from confluence.sampler.stream import BatchStream
    from confluence.toolkit.checkpoint import read_checkpoint, write_params
    from confluence.training.config import RunConfig

    if not name or "/" in name or name.startswith("."):
        raise ConfluenceError(f"pretrained model name {name!r}: use letters, digits, '-' or '_'")
    root = root or ROOT
    dest = root / name
    legacy = is_model_dir
    if outputs.claim(dest, "pretrained-model", legacy=legacy) == "ours" and not overwrite:
        raise ConfluenceError(f"pretrained model {name} already exists at {dest}; pass overwrite to replace it")
    ck = read_checkpoint(Path(run))
    cfg = RunConfig.from_dict(ck.meta["config"])
    params, _ = eqx.partition(load_transformer(cfg.model, ck.path), eqx.is_inexact_array)
    with outputs.locked(dest, "exported"), outputs.writing(dest, f"pretrained model {name}"):
        tmp = outputs.temp_dir(dest, "pretrained-model")
        try:
            meta = {k: v for k, v in ck.meta.items() if k != "stream"}  # the stream position is the run's
            meta["trained_tasks"] = sorted(BatchStream.drawn_tasks(ck.meta.get("stream")))
            write_params(tmp, params, meta)
            size = sum((tmp / f).stat().st_size for f in SHIPPED_FILES)
            if size > MAX_BYTES:
                raise ConfluenceError(f"pretrained model {name}: {size / 2**20:.1f} MiB, more than the "
                                      f"{MAX_BYTES >> 20} MiB a shipped model may take")
            # the run directory's name only: a path on the exporting machine means nothing to the model's users;
            # the code that trained it (toolkit/provenance.py; null for runs before 2026-11-25), never from `info`
            full = {"name": name, "step": ck.step, "source_run": Path(run).resolve().name, **info,
                    "code": ck.meta.get("code"), "bytes": size,
                    "sha256": {f: sha256(tmp / f) for f in SHIPPED_FILES}}
            (tmp / CARD).write_text(json.dumps(full, indent=2) + "\n")
            outputs.replace_dir(tmp, dest, "pretrained-model", legacy=legacy)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _verified.cache_clear()
    return dest


__all__ = ["CARD", "MAX_BYTES", "PREFIX", "ROOT", "SHIPPED_FILES", "_verified", "available", "card",
           "checkpoint_path", "export_pretrained", "is_pretrained", "sha256"]
