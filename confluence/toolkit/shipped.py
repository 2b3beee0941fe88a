"""The registry of shipped models: `pretrained:NAME` resolved to its directory under `confluence/pretrained/`, its
card read, its files checked against the card's sha256 at every load (a damaged or swapped file is an error, never a
silently different model).

It sits in the toolkit, below everything that loads a checkpoint (`toolkit.checkpoint.resolve_checkpoint`), so that
resolving a name imports nothing above it; making a shipped model from a run (`confluence.pretrained.export_pretrained`)
needs the model and lives with the models.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from confluence import outputs
from confluence.errors import ConfluenceError

PREFIX = "pretrained:"
ROOT = Path(__file__).resolve().parents[1] / "pretrained"  # the package folder of the shipped models
CARD = "card.json"
SHIPPED_FILES = ("state.eqx", "meta.json")
MAX_BYTES = 25 * 2**20  # what the repository accepts for a shipped model


def is_pretrained(spec: str | os.PathLike[str]) -> bool:
    """Whether `spec` names a shipped model (`pretrained:NAME`) rather than a path."""
    return str(spec).startswith(PREFIX)


def available(root: Path | None = None) -> list[str]:
    """The names of the shipped models."""
    root = root or ROOT
    return sorted(p.name for p in root.iterdir() if (p / CARD).is_file())


def card(name: str, root: Path | None = None) -> dict[str, Any]:
    """The model card of shipped model `name` (card.json)."""
    return json.loads((_dir(name, root) / CARD).read_text())


def _dir(name: str, root: Path | None) -> Path:
    root = root or ROOT
    d = root / name
    if not name or "/" in name or not (d / CARD).is_file():
        names = ", ".join(f"{PREFIX}{n}" for n in available(root)) or "none"
        raise ConfluenceError(f"no pretrained model {PREFIX}{name}; shipped: {names}")
    return d


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@cache
def _verified(d: Path) -> Path:
    want = json.loads((d / CARD).read_text()).get("sha256") or {}
    for f in SHIPPED_FILES:
        if f not in want:
            raise ConfluenceError(f"pretrained model {d.name}: its card.json records no sha256 of {f}")
        if not (d / f).is_file():
            raise ConfluenceError(f"pretrained model {d.name}: {f} is missing from {d}")
        got = sha256(d / f)
        if got != want[f]:
            raise ConfluenceError(f"pretrained model {d.name}: {d / f} has sha256 {got[:16]}..., its card records "
                                  f"{want[f][:16]}...: the file is damaged or not the one shipped; reinstall")
    return d


def checkpoint_path(spec: str | os.PathLike[str], root: Path | None = None) -> Path:
    """The checkpoint directory of `pretrained:NAME`, after checking its files against the card's sha256."""
    name = str(spec)[len(PREFIX):] if is_pretrained(spec) else str(spec)
    return _verified(_dir(name, root))


def is_model_dir(d: Path) -> bool:
    """A model directory exported before output markers: its shipped files and card, nothing else."""
    names = {p.name for p in d.iterdir()}
    return CARD in names and names <= {*SHIPPED_FILES, CARD, outputs.MARKER_FILE}


__all__ = ["CARD", "MAX_BYTES", "PREFIX", "ROOT", "SHIPPED_FILES", "available", "card", "checkpoint_path",
           "is_model_dir", "is_pretrained", "sha256"]
