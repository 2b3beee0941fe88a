"""`confluence bench quality`: the default recipe on every database of the development suite at a fixed budget, each
database's test split scored beside the trivial baselines and LightGBM on the same rows, and per database the tally
a user switching from LightGBM asks for: on how many tasks the model beats the trivial baseline, is not worse than
LightGBM (the paired 95 % interval reaches zero) and is better than it.

A suite folder holds `<name>/raw` (built by `confluence devsuite build`); this preprocesses each into
`<name>/store` (once), trains into `<name>/runs/<label>` and writes `<name>/runs/<label>/<split>.json`, then the
tallies. With `zero_shot` a trained checkpoint (`pretrained:small`) answers every database as it is, untrained on
it: the tally says how far a pretrained model carries. The validation split (`split="val"`) is where pretrained
models or recipes are compared; the check databases' test split is read once, for the one chosen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluence import outputs
from confluence.devsuite import MEMBERS, member, metadata_path
from confluence.errors import ConfluenceError
from confluence.evaluation.report import verdict
from confluence.fsutil import atomic_write_bytes
from confluence.stypes import SemanticType

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # what `--label` may be
TALLIES_KIND = "quality-tallies"  # the kind named in a `quality-<label>.json` confluence wrote


@dataclass
class Tally:
    """One database's counts over its tasks (what `bench quality` prints per row)."""

    database: str
    role: str
    tasks: int
    beats_trivial: int
    not_worse_than_gbdt: int
    better_than_gbdt: int
    # what `--blend gbdt` ships (the blend, or the trivial baseline where the floor chose it) not worse than
    # LightGBM; None: not measured
    blend_not_worse: int | None = None
    below_chance: int = 0  # boolean tasks whose AUROC is under 0.5: the model ranks them backwards

    def line(self) -> str:
        blend = "" if self.blend_not_worse is None else f" {self.blend_not_worse:>6}/{self.tasks:<3}"
        return (f"{self.database:<16} {self.role:<6} {self.tasks:>5} {self.beats_trivial:>6}/{self.tasks:<3} "
                f"{self.not_worse_than_gbdt:>6}/{self.tasks:<3} {self.better_than_gbdt:>6}/{self.tasks:<3} "
                f"{self.below_chance:>8}" + blend)


def header(blend: bool = True) -> str:
    """The column names above `Tally.line`s (the blend's column only where a blend was measured)."""
    return (f"{'database':<16} {'role':<6} {'tasks':>5} {'> trivial':>10} {'>= LightGBM':>11} {'> LightGBM':>10} "
            f"{'< chance':>8}" + (" blend >= LightGBM" if blend else ""))


def tally(database: str, role: str, results: dict[str, Any]) -> Tally:
    """Count a database's `evaluate --gbdt` results (`confluence.evaluation.evaluate` JSON layout) by verdict."""
    beats = not_worse = better = blend = backwards = 0
    n = 0
    blended = any("blend" in r for r in results.values())
    for r in results.values():
        if "model" not in r:
            continue
        n += 1
        said = {text for text, _ in verdict(r, SemanticType.parse(r["info"]["stype"]))}
        beats += "beats trivial" in said
        better += "better than GBDT" in said
        not_worse += bool(said & {"better than GBDT", "not worse than GBDT"})
        who = "shipped (trivial) " if r.get("ship") == "trivial" and "shipped" in r else "blend "
        blend += bool(said & {f"{who}better than GBDT", f"{who}not worse than GBDT"})
        auroc = r["model"].get("auroc") if SemanticType.parse(r["info"]["stype"]) == SemanticType.BOOLEAN else None
        backwards += auroc is not None and auroc < 0.5  # NaN (one class only) compares False
    return Tally(database, role, n, beats, not_worse, better, blend if blended else None, backwards)


def run_quality(suite: Path, *, names: list[str] | None = None, steps: int | str | None = None,
                config: str | None = None, label: str | None = None, max_seeds: int = 2000,
                log: Callable[[str], None] = print, force: bool = False, zero_shot: str | None = None,
                split: str = "test") -> list[Tally]:
    """Preprocess (once), train `config` for `steps` steps and evaluate `--gbdt` on `split` every suite member built
    under `suite` (on the test split also `--blend gbdt`, whose weight is chosen on validation); returns the
    tallies (also written to `suite/quality-<label>[-val].json`, a file only confluence's own tallies there may be
    replaced in). `steps` (default 3000) and `config` (default "small") choose the recipe trained; `zero_shot`: no
    training (so neither may be given); that checkpoint (a run, or `pretrained:NAME`) is evaluated on every
    database as it is. A database already evaluated under the same label is read back, not redone, unless
    `force`."""
    if split not in ("val", "test"):
        raise ConfluenceError(f"split {split!r}: the suite is measured on 'val' (to choose) or 'test' (once)")
    if zero_shot and (steps is not None or config is not None):
        given = [n for n, v in (("steps", steps), ("config", config)) if v is not None]
        raise ConfluenceError(f"{' and '.join(given)} {'choose' if len(given) > 1 else 'chooses'} the recipe "
                              f"trained on each database; with zero_shot nothing is trained ({zero_shot} answers "
                              f"as it is): leave {' and '.join(given)} out")
    steps = 3000 if steps is None else steps
    config = config or "small"
    label = label or (f"zeroshot-{_slug(zero_shot)}" if zero_shot else f"{config}-{steps}")
    if not LABEL.fullmatch(label):  # a folder and file name inside the suite, never a path out of it
        raise ConfluenceError(f"label {label!r}: use letters, digits, '.', '_' and '-' only, starting with a letter "
                              "or digit (it names SUITE/<db>/runs/<label> and SUITE/quality-<label>.json)")
    tallies = suite / (f"quality-{label}" + ("" if split == "test" else f"-{split}") + ".json")
    _check_tallies_file(tallies)  # before any work: a user's file there fails now, not after hours of training
    chosen = list(names) if names else [n for n in MEMBERS if (suite / n / "raw").is_dir()]
    if not chosen:
        raise ConfluenceError(f"{suite}: no suite database built there (confluence devsuite build NAME ... --out "
                              f"{suite}/NAME/raw); the suite has {', '.join(MEMBERS)}")
    model = None
    if zero_shot:
        from confluence.inference.predictor import load_model

        model = load_model(zero_shot)  # once for every database; a bad checkpoint fails before any work
    blend = "gbdt" if split == "test" and not zero_shot else None  # a blend's weight is chosen on validation
    with outputs.locked(tallies, "measured (bench quality)"):  # one measurement of a label at a time
        out = [_measure(suite, name, label=label, split=split, model=model, zero_shot=zero_shot, config=config,
                        steps=steps, blend=blend, max_seeds=max_seeds, force=force, log=log) for name in chosen]
        _check_tallies_file(tallies)
        record = {"written_by": "confluence", "kind": TALLIES_KIND, "label": label, "split": split,
                  "recipe": None if zero_shot else {"config": config, "steps": steps}, "zero_shot": zero_shot,
                  "tallies": [t.__dict__ for t in out]}
        atomic_write_bytes(tallies, (json.dumps(record, indent=2) + "\n").encode())
    return out


def _measure(suite: Path, name: str, *, label: str, split: str, model: Any, zero_shot: str | None, config: str,
             steps: int | str, blend: str | None, max_seeds: int, force: bool, log: Callable[[str], None]) -> Tally:
    """One suite database: preprocessed (once), trained (unless `model`: zero-shot), evaluated on `split` into
    `SUITE/<name>/runs/<label>/<split>.json` (read back when there), and tallied."""
    from confluence.evaluation.evaluate import evaluate, write_json
    from confluence.preprocess import preprocess

    mod = member(name)
    raw, store = suite / name / "raw", suite / name / "store"
    if not raw.is_dir():
        raise ConfluenceError(f"{raw}: not built; run confluence devsuite build {name} --source ... --out {raw}")
    if not (store / "metadata.json").is_file():
        log(f"{name}: preprocessing")
        preprocess(raw, metadata_path(name), store, progress=False)
    run = suite / name / "runs" / label
    result_file = run / f"{split}.json"
    # a run with no evaluation of either split did not finish: trained again (a finished one is kept, so its
    # validation and test splits are two readings of one run)
    finished = any((run / f"{s}.json").is_file() for s in ("val", "test"))
    if model is None and (force or not (run / "checkpoints").is_dir() or not finished):
        _train(store, run, config, steps, log, name)
    if model is not None:  # the folder holds only evaluations: one confluence wrote, or a new one
        outputs.claim(run, "benchmark")
    if force or not result_file.is_file() or (blend and not _has_blend(result_file)):  # measured before the blend
        log(f"{name}: evaluating " + (f"{zero_shot} zero-shot" if zero_shot else "the run") + f" on the {split} "
            f"split beside the trivial baselines, LightGBM" + (" and the blend" if blend else ""))
        results = evaluate(model or run, store, split=split, max_seeds=max_seeds, gbdt=True, blend=blend)
        if model is not None:
            outputs.mark(run, "benchmark")
        write_json(results, result_file)
    results = json.loads(result_file.read_text())
    seen = sum(bool((r.get("info") or {}).get("trained_on_task")) for r in results.values()) if zero_shot else 0
    if seen:  # e.g. a tune database in the pretraining corpus: its train split was read
        log(f"{name}: {zero_shot} trained on {seen} of its tasks: those answers are not zero-shot")
    t = tally(name, mod.ROLE, results)
    log(t.line())
    return t


def read_tallies(path: Path) -> list[dict[str, Any]] | None:
    """The tallies in a `quality-<label>.json` confluence wrote (also the bare list written before 2026-12-01), or
    None when the file holds anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data.get("written_by") == "confluence" and data.get("kind") == TALLIES_KIND:
        data = data.get("tallies")
    fields = set(Tally.__dataclass_fields__) - {"blend_not_worse", "below_chance"}
    if isinstance(data, list) and all(isinstance(t, dict) and fields <= set(t) for t in data):
        return data
    return None


def _check_tallies_file(path: Path) -> None:
    """Refuse to replace a file at the tallies' path that confluence did not write (a user's notes are kept)."""
    if path.is_symlink() or (path.exists() and (not path.is_file() or read_tallies(path) is None)):
        raise ConfluenceError(f"{path}: exists and was not written by confluence's bench quality; nothing was "
                              "changed. Move it away or choose another --label")


def _train(store: Path, run: Path, config: str, steps: int | str, log: Callable[[str], None], name: str) -> None:
    """Train `config` on one suite store into `run`: a fixed budget validates four times and evaluates its last
    step; "auto" / a duration is the recipe's own default (its run length, validation, early stopping, best step)."""
    from confluence.training.config import load_config
    from confluence.training.loop import open_stream, train

    log(f"{name}: training {config} for " + (f"{steps} steps" if isinstance(steps, int) else
                                              f"the recipe's run length ({steps})"))
    cfg = load_config(config, {"loop": {"max_steps": steps, "ckpt_every": steps, "val_every": max(steps // 4, 1),
                                        "patience": 0}} if isinstance(steps, int) else {"loop": {"max_steps": steps}})
    stream = open_stream([store], cfg)
    try:
        train(cfg, stream, run, progress=False, force=True)
    finally:
        stream.close()


def _slug(checkpoint: str) -> str:
    """A label part naming a checkpoint: `pretrained:small` -> `pretrained-small`, a run folder -> its name."""
    text = checkpoint.replace("pretrained:", "pretrained-") if checkpoint.startswith("pretrained:") \
        else Path(checkpoint).name
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text) or "checkpoint"


def _has_blend(result_file: Path) -> bool:
    """Whether a database's `test.json` holds the blend's scores (runs measured before it are evaluated again)."""
    try:
        return any("blend" in r for r in json.loads(result_file.read_text()).values())
    except (OSError, ValueError):
        return False
