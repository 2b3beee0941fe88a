"""`evaluate`: per-task metrics of a checkpoint on a split of a store, beside the trivial baselines on the same rows.

Metrics are computed on the targets that are not null (the type-specific head); the null head is scored separately
(`null_auroc`) where the split has both null and non-null targets. Numbers are in the user's units: numerical
targets de-normalized with the task's statistics, timestamps in days. The trivial baselines (majority class, mean,
median) are fitted on the train split's targets of the same task.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from confluence.errors import ConfluenceError
from confluence.evaluation import metrics as M
from confluence.inference.draws import DEFAULT_DRAWS
from confluence.inference.predictor import HeadOutputs, LoadedModel, Predictor, load_model
from confluence.sampler.config import labels_for
from confluence.sampler.splits import subsample
from confluence.stypes import SemanticType
from confluence.targets import decode_targets, kind, sigmoid
from confluence.toolkit.progress import Reporter, per_row


@dataclass(frozen=True)
class EvalRows:
    """The scored rows of one task (`evaluate(keep_rows=True)`), for plots: `truth` the non-null targets and `pred`
    the model's predictions on them, in the units of `model_point_predictions`; `gbdt` LightGBM's on the same rows
    (None without it); `blend` the blend's (`--blend gbdt`; None without it); `categories` the class names of a
    categorical target; `trivial` the trivial baselines' predictions (for RelBench's metrics,
    `confluence.evaluation.relbench`). Never written to JSON."""

    truth: np.ndarray
    pred: np.ndarray
    gbdt: np.ndarray | None = None
    blend: np.ndarray | None = None
    categories: list[str] | None = None
    trivial: dict[str, np.ndarray] | None = None  # the trivial baselines' predictions on the same rows, by name
    train_std: float | None = None  # numerical targets: std of the train targets (normalized MAE)
    seed_ids: np.ndarray | None = None  # the evaluated seeds (all of them, null targets too), in order
    head: HeadOutputs | None = None  # the model's head outputs on `seed_ids` (what `predict` would compute)
    clip_ids: np.ndarray | None = None  # the train seeds that bound numerical predictions (None: not clipped)


def model_point_predictions(predictor: Predictor, task: str, out: HeadOutputs, keep: np.ndarray,
                            clip_numbers: bool = True) -> np.ndarray:
    """The model's predictions on the rows `keep` in the units of the metrics: denormalized values (numerical,
    rounded and clipped as the train targets imply, exactly as `predict` reports them), P(true) (boolean), [n, K]
    probabilities (categorical), epoch microseconds (timestamp)."""
    store = predictor.store
    train_ids = predictor.seed_ids("train", task) if clip_numbers else None  # None: seed 004's plain value
    return kind(store.task(task).target_stype).model_predictions(store, task, out, keep, train_ids)


def model_metrics(stype: SemanticType, truth_values: np.ndarray, truth_null: np.ndarray, pred: np.ndarray,
                  null_logit: np.ndarray, train_std: float | None) -> dict[str, float]:
    """Metrics of the model against decoded ground truth: the type head's (`pred` from `model_point_predictions`,
    on the non-null rows) plus the null head's AUROC where the rows have both null and non-null targets."""
    res = M.metrics_for(stype, truth_values[~truth_null], pred, target_std=train_std)
    if truth_null.any() and not truth_null.all():
        res.update(M.null_metrics(truth_null, sigmoid(null_logit)))
    return res


def evaluate(
    checkpoint: str | Path | LoadedModel,
    db: str | Path,
    *,
    split: str = "test",
    tasks: Sequence[str] | None = None,
    max_seeds: int | None = 5000,
    batch_size: int | None = None,
    threads: int | None = None,
    gbdt: bool = False,
    gbdt_max_train: int = 50_000,
    progress: Reporter | None = None,
    reference: Callable[[str, np.ndarray, Any], dict[str, Any]] | None = None,
    keep_rows: bool = False,
    clip_numbers: bool = True,
    draws: int = DEFAULT_DRAWS,
    blend: str | None = None,
    certify: int = 0,
    importance: int = 0,
    explain: int = 0,
) -> dict[str, dict[str, Any]]:
    """Evaluate a checkpoint on `split` of the store at `db`.

    Returns `{task: {"model": {...}, "baseline": {...best trivial...}, "<trivial name>": {...}, ["gbdt": {...},
    "model_vs_gbdt": {diff, ci_low, ci_high, n_boot, a_not_worse}], "info": {...}}}` — the JSON layout of
    `confluence evaluate --json` (`model_vs_gbdt`: the headline metric's paired-bootstrap difference).
    `reference(task, eval_ids, store) -> {name: metrics}` adds other scores of exactly the evaluated rows (task seed
    ids of the store), e.g. a planted database's Bayes predictor (`confluence bench learnability`).
    `keep_rows` adds `"rows"`: an `EvalRows` per task (truth and predictions, for the report's plots; not JSON).
    `clip_numbers=False` scores numbers plainly de-normalized (seed 004) instead of as `predict` reports them.
    `draws`: contexts per seed whose answers are combined (`inference.combine_draws`; 1: one context, as before).
    `progress` (a `confluence.toolkit.progress.Reporter`) shows each task's model inference and LightGBM stages.
    `blend="gbdt"` (implies `gbdt`) also blends the model with LightGBM, one weight per task chosen on the
    validation split (`confluence.evaluation.blend`): both predict up to `max_seeds` validation seeds (LightGBM
    fitted on train seeds only, the model with validation contexts, which show train labels only), and each task
    gains `"blend"` (its metrics on the evaluated rows, `weight`, `n_val`), `"blend_vs_gbdt"` (as
    `model_vs_gbdt`), `"validation"` (`BlendFit.summary`: the headline metric of model, LightGBM and the best
    blend on validation, the weight shipped and the best one, the best blend's gain over LightGBM there with its
    paired interval (`val_gain`, `val_ci`) and the guard's outcome, where the weight came from, and a `note` when
    the weight is a default, the guard shipped LightGBM, or the evaluated split is "val" itself) and `"ship"`
    ("model", "LightGBM" or "blend": what validation says to ship; LightGBM unless validation shows a departure
    from it helps).
    `certify` > 0 also checks that many seeds a task for leakage (`confluence.evaluation.certify`: their contexts
    bit-identical with the future randomized) and adds `"certificate"` to each task (its summary, the digest of
    the whole certificate and `passed`); a failed certificate is reported, not raised.
    `importance` > 0 adds `"importance"` to each task: the model's permutation importance of each column on that
    many validation seeds (`confluence.evaluation.importance`, the ten largest) and, with `gbdt`, LightGBM's gain
    share of each column, side by side.
    `explain` > 0 adds `"explanations"` to each task: that many evaluated seeds (with a label, spread over the
    split) explained (`confluence.inference.explain`: the context rows that moved each answer most), each with
    its `truth`.
    """
    from confluence.evaluation.blend import check_blend

    gbdt = gbdt or check_blend(blend) is not None
    loaded = checkpoint if isinstance(checkpoint, LoadedModel) else load_model(checkpoint)
    predictor = Predictor(loaded, db, batch_size=batch_size, threads=threads, draws=draws)
    store = predictor.store
    names = [t.name for t in store.tasks] if not tasks else list(tasks)
    unknown = [t for t in names if t not in {x.name for x in store.tasks}]
    if unknown:
        raise ConfluenceError(f"task(s) {unknown} not in store {store.name!r} (tasks: {[t.name for t in store.tasks]})")
    builder = None
    results: dict[str, dict[str, Any]] = {}
    try:
        for task in names:
            info = store.task(task)
            stype = SemanticType(int(info.target_stype))
            eval_ids = subsample(predictor.seed_ids(split, task), max_seeds)
            train_ids = predictor.seed_ids("train", task)
            if len(eval_ids) == 0:
                results[task] = {"info": {"stype": stype.label, "n_eval": 0, "note": f"no seeds in split {split!r}"}}
                continue
            truth = decode_targets(store, task, eval_ids)
            if truth.is_null.all():  # e.g. RelBench's test table without its target column
                results[task] = {"info": {"stype": stype.label, "split": split, "n_eval": int(len(eval_ids)),
                                          "n_eval_non_null": 0, "no_labels": True, "note": no_labels_note(split)}}
                continue
            train = decode_targets(store, task, train_ids)
            train_vals = train.values[~train.is_null]
            train_std = kind(stype).target_std(train_vals)
            if progress is not None:  # counted in rows, whatever the contexts drawn per row
                progress.step(f"{task}: model", len(eval_ids))
            out = predictor.task_outputs(task, eval_ids, None if progress is None else
                                         per_row(progress.advance, predictor.draws), context=split)
            keep = ~truth.is_null
            pred = model_point_predictions(predictor, task, out, keep, clip_numbers)
            model = model_metrics(stype, truth.values, truth.is_null, pred, out.null_logit, train_std)
            trivial = M.trivial_baselines(stype, train_vals, truth.values[~truth.is_null],
                                          num_classes=truth.num_classes or None)
            row_preds = kind(stype).row_baselines(store, task, train_ids, eval_ids, train, truth)
            for name, row_pred in row_preds.items():
                trivial[name] = M.metrics_for(stype, truth.values[keep], row_pred)
            best_name, best = M.best_baseline(stype, trivial)
            entry: dict[str, Any] = {"model": model, "baseline": {**best, "name": best_name}}
            entry.update(trivial)
            blended = None
            if gbdt:
                from confluence.evaluation.gbdt import FeatureBuilder, fit_gbdt

                builder = builder or FeatureBuilder(store, progress=progress)
                val_ids = subsample(predictor.seed_ids("val", task), max_seeds) if blend else None
                g = fit_gbdt(store, task, train_ids, eval_ids, builder=builder, max_train=gbdt_max_train,
                             progress=progress, val_ids=val_ids)
                entry["gbdt"] = g.metrics
                # paired bootstrap of model minus GBDT on the same rows: is a gap more than row-sampling noise?
                entry["model_vs_gbdt"] = M.paired_bootstrap(stype, truth.values[keep], pred, g.predictions)
                if blend:
                    blended = _blend_entry(entry, predictor, task, split, val_ids, g.val_predictions,
                                           (eval_ids, out), truth.values[keep], pred, g.predictions, train_ids,
                                           train_std, clip_numbers, progress)
            if importance:
                entry["importance"] = _importance(predictor, task, importance, g.model if gbdt else None)
            if explain:
                entry["explanations"] = _explanations(predictor, task, eval_ids[keep], truth.values[keep], explain,
                                                      split, progress)
            if reference is not None:
                entry.update(reference(task, eval_ids, store))
            entry["info"] = {"stype": stype.label, "split": split, "n_eval": int(len(eval_ids)),
                             "n_eval_non_null": int((~truth.is_null).sum()), "n_train": int(len(train_ids)),
                             "checkpoint_step": loaded.step,
                             # zero-shot when the checkpoint never trained on this task; its labelled rows per context
                             "trained_on_task": loaded.trained_on(store.name, task),
                             "context_labels": labels_for(loaded.config.sampler, store.name, task),
                             "context_draws": predictor.draws}
            if keep_rows:
                trivial_preds = M.trivial_predictions(stype, train_vals, int(keep.sum()),
                                                      num_classes=truth.num_classes or None)
                trivial_preds.update(row_preds)
                entry["rows"] = EvalRows(truth=truth.values[keep], pred=pred, gbdt=g.predictions if gbdt else None,
                                         blend=blended, categories=truth.categories, trivial=trivial_preds,
                                         train_std=train_std, seed_ids=eval_ids, head=out,
                                         clip_ids=train_ids if clip_numbers else None)
            results[task] = entry
        if certify:
            from confluence.evaluation.certify import certify as run_certificate

            cert = run_certificate(store, loaded.config.sampler, names, split, run_seed=loaded.config.seed,
                                   max_seeds=certify, progress=progress)
            for task in names:
                if task in results:
                    results[task]["certificate"] = {**cert["tasks"][task], "digest": cert["digest"]}
    finally:
        predictor.close()
    return results


def _blend_entry(entry: dict[str, Any], predictor: Predictor, task: str, split: str, val_ids: np.ndarray,
                 gbdt_val: np.ndarray, evaluated: tuple[np.ndarray, HeadOutputs], truth: np.ndarray, pred: np.ndarray,
                 gbdt_pred: np.ndarray, train_ids: np.ndarray, train_std: float | None, clip_numbers: bool,
                 progress: Reporter | None) -> np.ndarray:
    """Add a task's blend to its results (`evaluate(blend="gbdt")`): the model's predictions on the validation
    seeds (the evaluated ones reused when the split is "val"), the weight chosen there, the blend's metrics on the
    evaluated rows and its paired bootstrap against LightGBM. Returns the blend's predictions on those rows."""
    from confluence.evaluation.blend import blend_predictions, fit_blend
    from confluence.evaluation.trivial import fit_trivial, seed_obs
    from confluence.targets import train_target_range

    store = predictor.store
    stype = SemanticType(int(store.task(task).target_stype))
    val = decode_targets(store, task, val_ids)
    keep_val = ~val.is_null
    if split == "val" and np.array_equal(evaluated[0], val_ids):
        out_val = evaluated[1]  # the same seeds with the same contexts: no second inference
    elif keep_val.any():
        if progress is not None:
            progress.step(f"{task}: model on validation seeds (blend weight)", len(val_ids))
        out_val = predictor.task_outputs(task, val_ids, None if progress is None else
                                         per_row(progress.advance, predictor.draws), context="val")
    else:
        out_val = None
    pred_val = (model_point_predictions(predictor, task, out_val, keep_val, clip_numbers) if out_val is not None
                else np.zeros((0,) + np.shape(gbdt_val)[1:]))
    rng = train_target_range(store, task, train_ids) if clip_numbers else None
    trivial = fit_trivial(store, task, train_ids, num_classes=val.num_classes or None)
    fit = fit_blend(stype, val.values[keep_val], pred_val, gbdt_val, target_range=rng,
                    trivial=trivial.predictions(int(keep_val.sum()), seed_obs(store, task, val_ids[keep_val])))
    blended = blend_predictions(stype, pred, gbdt_pred, fit.weight, target_range=rng)
    entry["blend"] = {**M.metrics_for(stype, truth, blended, target_std=train_std), "weight": fit.weight,
                      "n_val": fit.n_val}
    entry["blend_vs_gbdt"] = M.paired_bootstrap(stype, truth, blended, gbdt_pred)
    shipped = blended
    if fit.ship == "trivial":  # the floor shipped a baseline: what a user of --blend receives is scored as well
        ev = decode_targets(store, task, evaluated[0])
        obs = seed_obs(store, task, evaluated[0][~ev.is_null])
        shipped = trivial.predictions(len(truth), obs).get(fit.trivial_name, blended)
    entry["shipped"] = {**M.metrics_for(stype, truth, shipped, target_std=train_std), "ship": fit.ship}
    entry["shipped_vs_gbdt"] = M.paired_bootstrap(stype, truth, shipped, gbdt_pred)
    entry["validation"] = fit.summary()
    if split == "val":
        entry["validation"]["note"] = "; ".join(
            ([fit.note] if fit.note else []) + ["the evaluated rows are the validation rows the weight and the ship "
                                                "choice were chosen on: the blend's scores here are optimistic; "
                                                "judge it on --split test"])
    entry["ship"] = fit.ship
    return blended


def _importance(predictor: Predictor, task: str, n_seeds: int, gbdt_model: Any) -> dict[str, Any]:
    """A task's column importance (`evaluate(importance=...)`): the model's on validation seeds, LightGBM's gain
    share beside it (same columns first)."""
    from confluence.evaluation.importance import gbdt_importance, model_importance

    ids = subsample(predictor.seed_ids("val", task), n_seeds)
    if len(ids) == 0:
        return {"note": "no validation seeds"}
    out: dict[str, Any] = {"model": model_importance(predictor, task, ids, context="val", top=10)}
    if gbdt_model is not None:
        gains = gbdt_importance(gbdt_model)
        shown = list(out["model"]["columns"]) + [c for c in gains if c not in out["model"]["columns"]][:5]
        out["gbdt_gain_share"] = {c: round(gains.get(c, 0.0), 4) for c in shown}
    return out


def _explanations(predictor: Predictor, task: str, ids: np.ndarray, truth: np.ndarray, n: int, split: str,
                  progress: Any) -> list[dict[str, Any]]:
    """`n` of the evaluated seeds explained (`evaluate(explain=...)`), each with its true value as a user reads it."""
    from confluence.inference.explain import Explainer

    k = kind(predictor.store.task(task).target_stype)
    at = np.unique(np.linspace(0, ids.size - 1, min(n, ids.size)).astype(np.int64)) if ids.size else ids
    if progress is not None:
        progress.step(f"{task}: explanations", at.size)
    out = Explainer(predictor, task).seeds(ids[at], split, None if progress is None else progress.advance)
    info = predictor.store.task(task)
    return [{**e.to_dict(), "truth": k.value_text(predictor.store, info, truth[j])} for e, j in zip(out, at,
                                                                                                  strict=True)]


def no_labels_note(split: str) -> str:
    """What evaluate reports for a split whose targets are all NULL (hidden labels)."""
    return (f"no labels in split {split!r}: every target is NULL (hidden labels, such as a RelBench test table"
            f" without its target column); nothing to score, but `confluence predict --split {split}` predicts them")


def write_json(results: Any, path: str | Path) -> Path:
    """Write evaluation results as JSON (NaN -> null) atomically: a temporary file renamed into place, so an
    interrupted write never leaves a truncated file that later parses as something else or fails to load."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(clean_json(results), indent=2))
    tmp.replace(path)
    return path


def clean_json(obj: Any) -> Any:
    """NaN / inf -> None so the result is valid JSON; `EvalRows` entries (per-row arrays) are dropped."""
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items() if not isinstance(v, EvalRows)}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, np.floating | np.integer):
        return clean_json(obj.item())
    return obj
