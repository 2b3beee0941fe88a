"""CLI of evaluation: `confluence evaluate`, `confluence predict`, `confluence baseline`."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import typer

from confluence import outputs
from confluence.cli.common import fail
from confluence.inference.draws import DEFAULT_DRAWS


def results_lines(results: dict, title: str) -> list[str]:
    """The results as lines of at most ~76 characters (rich markup): per task a header (name, type, rows scored,
    verdict), then its headline metric (↑ / ↓) and the other metrics, model beside the best trivial baseline and
    LightGBM, and the model's gain over LightGBM oriented so that positive = the model is better. With a blend
    (`evaluate --blend gbdt`) a blend column, the model's and the blend's gains on lines of their own, and what to
    ship with the validation scores it rests on."""
    from confluence.evaluation.metrics import HEADLINE
    from confluence.evaluation.report import n_scored, verdict
    from confluence.stypes import SemanticType

    def num(v) -> str:
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"

    paired = any("model_vs_gbdt" in r for r in results.values())
    blended = any("blend" in r for r in results.values())  # --blend gbdt: a blend column, gains on their own lines
    scorers = ("model", "baseline", "gbdt", "blend") if blended else ("model", "baseline", "gbdt")
    lines = [f"[bold]{title}[/]", ""]
    head = f"    {'metric':<17}{'model':>11}{'trivial':>11}{'GBDT':>11}" + (f"{'blend':>11}" if blended else "")
    lines.append(head + ("  gain vs GBDT [95% CI]" if paired and not blended else ""))
    if blended:
        lines += textwrap.wrap("(gain: how much better than LightGBM, negative = worse; blend: w x model + (1 - w) "
                               "x LightGBM, w chosen on validation; ship: what validation says to use)", 76,
                               initial_indent="    ", subsequent_indent="    ")
    elif paired:
        lines.append("    (gain: how much better the model is than LightGBM; negative = worse)")
    for task, r in results.items():
        info = r.get("info", {})
        if "model" not in r and "baseline" not in r:
            lines += ["", f"[bold]{task}[/] ({info.get('stype', '?')})"]
            lines += textwrap.wrap(info.get("note", "not evaluated"), 76, initial_indent="    ",
                                   subsequent_indent="    ")
            continue
        stype = SemanticType.parse(info["stype"])
        head_metric, higher = HEADLINE[stype]
        words = ", ".join(t for t, _ in verdict(r, stype)) if "model" in r else ""
        n = n_scored(r)
        trivial_name = (r.get("baseline") or {}).get("name")
        unseen = info.get("trained_on_task") is False  # zero-shot: the checkpoint never trained on this task
        lines += ["", f"[bold]{task}[/] ({stype.label}, n = {n if n is not None else '?'}"
                  + (f", trivial = {trivial_name}" if trivial_name else "") + ")"
                  + (" [yellow]not trained on[/]" if unseen else "")]
        if words:
            lines += textwrap.wrap(f"verdict: {words}", 76, initial_indent="    ", subsequent_indent="      ")
        metrics = [m for m in (r.get("model") or r["baseline"]) if m not in ("n", "name")]
        metrics.sort(key=lambda m: m != head_metric)
        metrics = [m for m in metrics if m not in ("weight", "n_val")]
        for i, m in enumerate(metrics):
            vals = [(r.get(k) or {}).get(m) for k in scorers]
            cells = [f"{num(v):>11}" for v in vals]
            if i == 0:
                finite = [(v, j) for j, v in enumerate(vals) if v is not None and not math.isnan(v)]
                if finite:
                    best = (max if higher else min)(finite)[1]
                    cells[best] = f"[bold green]{cells[best]}[/]"
            label = m + (" ↑" if higher else " ↓") if i == 0 else m
            line = f"    {label:<17.17}{''.join(cells)}"
            if i == 0 and paired and not blended:
                line += gain_text(r.get("model_vs_gbdt"), higher)
            lines.append(line)
        if blended:
            for who in ("model", "blend") + (("shipped",) if r.get("ship") == "trivial" else ()):
                if f"{who}_vs_gbdt" in r:
                    label = "shipped (trivial)" if who == "shipped" else who
                    lines.append(f"    gain vs GBDT, {label}:{gain_text(r[f'{who}_vs_gbdt'], higher)}")
            if "ship" in r:
                lines += textwrap.wrap(ship_text(r), 76, initial_indent="    ", subsequent_indent="      ")
    return lines


def gain_text(c: dict | None, higher: bool) -> str:
    """`  +gain [low, high]` of a paired comparison with LightGBM, oriented so that positive = better than it."""
    from confluence.evaluation.report import oriented_vs_gbdt

    o = oriented_vs_gbdt(c, higher)
    if o is None:
        return "  –"
    return f"  {o[0]:+.3g}" + (f" [{o[1]:+.3g}, {o[2]:+.3g}]" if math.isfinite(o[1]) else "")


def ship_text(r: dict) -> str:
    """One task's ship choice in words: what to ship, the weight, the validation scores it rests on, and the
    guard (`blend.guard_words`: the best blend's gain over LightGBM there and its interval; when the guard shipped
    LightGBM, the note says so with the interval)."""
    from confluence.evaluation.blend import choice_words

    v = r.get("validation") or {}

    def num(x) -> str:
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"

    ship = r["ship"] if r["ship"] != "trivial" else f"trivial baseline ({v.get('trivial_name', '?')})"
    text = (f"ship: {ship} (w = {num(v.get('weight'))} model share; validation {v.get('metric', '?')} on "
            f"{v.get('n_val', 0):,} rows: model {num(v.get('model'))}, LightGBM {num(v.get('LightGBM'))}, blend "
            f"{num(v.get('blend'))}{choice_words(v, num)})")
    return text + (f"; {v['note']}" if v.get("note") else "")


def print_results(results: dict, title: str) -> None:
    """Print `results_lines`: readable at 80 columns and in a log file (no table borders to wrap)."""
    from rich.console import Console

    console = Console(highlight=False)
    for line in results_lines(results, title):
        console.print(line, soft_wrap=True)


def link_results_lines(results: dict, title: str) -> list[str]:
    """Link tasks' results as lines: per task its k and rows scored, then MAP@k (the headline), precision, recall
    and NDCG at k, one column per ranker, the best baseline marked."""
    from confluence.targets.link import METRICS

    def num(v) -> str:
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    lines = [f"[bold]{title}[/]"]
    for task, r in results.items():
        info = r.get("info", {})
        rankers = [n for n in ("model", "gbdt", "popularity", "recent_popularity", "past_targets", "co_linked")
                   if n in r]
        lines += ["", f"[bold]{task}[/] (link to {info.get('target_table', '?')}, k = {info.get('k', '?')}, "
                  f"n = {info.get('n_eval', '?')})"]
        if not rankers:
            lines.append(f"    {info.get('note', 'not evaluated')}")
            continue
        best = (r.get("baseline") or {}).get("name")
        short = {"popularity": "popular", "recent_popularity": "recent", "past_targets": "past", "co_linked": "co-linked",
                 "gbdt": "GBDT"}
        lines.append(f"    {'metric@k':<12}" + "".join(f"{short.get(n, n) + ('*' if n == best else ''):>10}"
                                                       for n in rankers))
        for m in METRICS:
            lines.append(f"    {m + (' ↑' if m == 'map' else ''):<12}" + "".join(f"{num(r[n].get(m)):>10}"
                                                                             for n in rankers))
        for key, who, against in (("gbdt_vs_best_baseline", "GBDT", None), ("model_vs_baseline", "model", None),
                                  ("model_vs_gbdt", "model", "GBDT")):
            if c := r.get(key):
                other = against or short.get(c.get("baseline"), c.get("baseline"))
                lines.append(f"    {who} - {other} MAP@k: {c['diff']:+.4f} [{c['ci_low']:+.4f}, {c['ci_high']:+.4f}]"
                             " (paired bootstrap, 95%)")
        lines.append("    (* the best baseline by MAP@k; popular: most linked rows known at the observation "
                     "time; recent: the same over the last horizon; past: the anchor's own earlier targets; "
                     "co-linked: rows other anchors linked to along with them"
                     + ("; GBDT: LightGBM LambdaRank over past and popular rows" if "gbdt" in r else "") + ")")
        if sel := info.get("ranker"):
            ways = ", ".join(f"{n} {v:.4f}" for n, v in sel["calibration_map"].items())
            lines.append(f"    model ranks by: {sel['choice']} (cross-validated MAP@k on {sel['n_seeds']} "
                         f"calibration seeds: {ways})")
        if info.get("note"):
            lines.append(f"    {info['note']}")
    return lines


def print_link_results(results: dict, title: str) -> None:
    """Print `link_results_lines`."""
    from rich.console import Console

    console = Console(highlight=False)
    for line in link_results_lines(results, title):
        console.print(line, soft_wrap=True)


def evaluate_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Run directory or checkpoint directory."),
    db: Path = typer.Option(..., "--db", help="Processed store (need not be one the model was trained on)."),
    split: str = typer.Option("test", "--split", help="train | val | test"),
    task: list[str] = typer.Option(None, "--task", metavar="TASK", help="Task to evaluate (repeatable); default: every task."),
    json_out: Path = typer.Option(None, "--json", help="Write the results as JSON here."),
    report: Path = typer.Option(None, "--report", metavar="DIR", help="Also write the HTML report into DIR "
                                "(DIR/report.html, self-contained: per task the verdict, the plots of the evaluated "
                                "rows, every metric and the run's training curves)."),
    relbench_json: Path = typer.Option(None, "--relbench-json", help="Also write RelBench's result layout here: "
                                       "val and test, RelBench's metric names, for the tasks from RelBench task "
                                       "folders (or --task); of a link run, its link tasks with their top-k "
                                       "keys (RelBench's pred); docs/guide/relbench.md."),
    max_seeds: int = typer.Option(None, "--max-seeds", help="Evaluate at most this many seeds per task (0: all; "
                                  "default 5000, all with --relbench-json)."),
    gbdt: bool = typer.Option(False, "--gbdt/--no-gbdt", help="Also train and score the LightGBM baseline."),
    blend: str = typer.Option(None, "--blend", metavar="gbdt", help="Also blend the model with LightGBM (implies "
                              "--gbdt): per task a weight chosen on the validation split, the blend scored beside "
                              "both, and which to ship (LightGBM unless a paired interval on validation shows "
                              "departing from it helps, or LightGBM is not shown better than the trivial baseline; "
                              "the trivial baseline where nothing is shown better than it)."),
    clip_numbers: bool = typer.Option(True, "--clip-numbers/--no-clip-numbers",
                                      help="Score numbers as predict reports them (train range, rounded when whole); "
                                           "--no-clip-numbers: the plain de-normalized number."),
    draws: int = typer.Option(DEFAULT_DRAWS, "--draws", min=1, help="Contexts drawn per seed, their answers combined "
                              "(probabilities averaged, numbers by median); 1: one context, the fastest."),
    batch_size: int = typer.Option(None, "--batch-size", help="Sequences per forward pass (default: the run's on a "
                                   "CPU, 65,536 cells' worth on a GPU)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Sampler threads (default: 1 on a CPU, the CPUs "
                                "less 2 on a GPU)."),
    certify: bool = typer.Option(False, "--certify", help="Also prove the contexts leak nothing, on up to "
                                 "--certify-seeds seeds a task (docs/design/evaluation.md, \"The leakage "
                                 "certificate\"). A leak is an error naming the task, anchor, table, row and column."),
    certify_seeds: int = typer.Option(200, "--certify-seeds", min=1, help="Seeds a task the certificate checks."),
    importance: int = typer.Option(0, "--importance", min=0, metavar="SEEDS", help="Also say which columns each "
                                   "task relies on: the model's permutation importance on this many validation "
                                   "seeds, beside LightGBM's gain share with --gbdt; in the JSON and the report "
                                   "(0: off; costs a forward pass per column)."),
    explain: int = typer.Option(0, "--explain", min=0, metavar="ROWS", help="Also explain this many evaluated "
                                "rows a task (spread over the split): the context rows and cells that moved each "
                                "answer most, with its truth; in the JSON and the report (0: off)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar / progress lines."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file that confluence did not "
                               "write (a Parquet file of an earlier predict is replaced without it)."),
) -> None:
    """Per-task metrics of a checkpoint beside the trivial baselines (majority / mean / median) on the same rows."""
    from confluence.errors import ConfluenceError
    from confluence.evaluation.blend import check_blend
    from confluence.evaluation.evaluate import evaluate, write_json
    from confluence.inference.predictor import load_model
    from confluence.toolkit.progress import Reporter

    splits = [split]
    if max_seeds is None:
        max_seeds = 0 if relbench_json else 5000
    try:
        check_blend(blend)  # before anything loads
        from confluence.toolkit.compile_cache import use_compile_cache

        use_compile_cache()  # a second evaluate loads the compiled model instead of compiling it (~6 s on 2 cores)
        for f in (json_out, relbench_json, report / "report.html" if report else None):  # before minutes of work
            if f is not None:
                outputs.claim_file(f, force=force)
        if relbench_json:
            from confluence.evaluation.relbench import RELBENCH_SPLITS, relbench_results, relbench_tasks
            from confluence.store import Store

            if split not in RELBENCH_SPLITS:
                raise ConfluenceError(f"--relbench-json reports val and test; --split {split!r} (the split --json "
                                      "writes) must be one of them")
            store = Store.open(db)
        found = _link_evaluation(checkpoint, db, task, list(RELBENCH_SPLITS) if relbench_json else [split],
                                 max_seeds, gbdt)
        if found is not None:  # a checkpoint with a link head answers link tasks
            loaded, links = found
            for s in links.results:
                print_link_results(links.results[s], f"{db} — link tasks, split {s}")
            if json_out:
                typer.echo(f"wrote {write_json(links.results[split], json_out)}")
            if relbench_json:
                from confluence.evaluation.relbench import relbench_link_results

                res = relbench_link_results(store, links.results, links.rankings, loaded.step)
                typer.echo(f"wrote {write_json(res, relbench_json)}")
            return
        if relbench_json:
            task = task or relbench_tasks(store.meta)
            if not task:
                raise ConfluenceError(f"no task of {db} comes from a RelBench task folder (a task whose split "
                                      "names each row's file); name tasks with --task")
            splits = list(RELBENCH_SPLITS)
        by_split = {}
        with Reporter(enabled=not no_progress) as rep:
            model = load_model(checkpoint) if len(splits) > 1 else checkpoint  # loaded once for both splits
            for s in splits:
                by_split[s] = evaluate(model, db, split=s, tasks=task or None, max_seeds=max_seeds or None,
                                       gbdt=gbdt, batch_size=batch_size, threads=threads, progress=rep,
                                       clip_numbers=clip_numbers, keep_rows=bool(relbench_json or report),
                                       draws=draws, blend=blend, certify=certify_seeds if certify else 0,
                                       importance=importance, explain=explain)
    except ConfluenceError as exc:
        fail(exc)
    for s in splits:
        print_results(by_split[s], f"{db} — split {s}")
    if json_out:
        typer.echo(f"wrote {write_json(by_split[split], json_out)}")
    if relbench_json:
        typer.echo(f"wrote {write_json(relbench_results(by_split, dataset=store.name), relbench_json)}")
    if report:
        typer.echo(f"wrote {_write_report(report, by_split[split], checkpoint, db, split)}")
    if certify:
        _print_certificate(by_split[split])


def _link_evaluation(checkpoint: Path, db: Path, tasks: list[str] | None, splits: list[str],
                     max_seeds: int, gbdt: bool) -> tuple | None:
    """The loaded checkpoint and `evaluate_link_splits` of it, when it was trained with a link head
    (`train-links`), on the store's link tasks (those of `tasks`, default those it trained on); None for a checkpoint
    without one or a store without link tasks, whose cell tasks `evaluate` scores."""
    from confluence.evaluation.links import evaluate_link_splits
    from confluence.inference.predictor import load_model
    from confluence.store import Store
    from confluence.toolkit.checkpoint import read_checkpoint

    meta = read_checkpoint(Path(checkpoint)).meta
    if not (meta.get("link_task") or meta.get("link_tasks")) or not Store.open(db).link_tasks:
        return None  # no link head, or no link task here: the cell tasks are scored
    loaded = load_model(checkpoint)
    return loaded, evaluate_link_splits(loaded, db, splits=splits, tasks=tasks or None, max_seeds=max_seeds or None,
                                        gbdt=gbdt)


def _print_certificate(results: dict) -> None:
    """The certificate's verdict per task and its digest; exit 1 naming every leak found (at most 10 a task)."""
    from confluence.evaluation.certify import Leak

    certs = {t: r["certificate"] for t, r in results.items() if "certificate" in r}
    leaks = []
    for t, c in certs.items():
        verdict = "no leak" if c["passed"] else f"{c['n_leaks']} leaking cell(s)"
        extra = f" ({c['note']})" if c.get("note") else ""
        typer.echo(f"certificate {t}: {c['seeds']} contexts rebuilt with the future randomized: {verdict}{extra}")
        for w in c.get("warnings", []):
            typer.echo(f"  warning: {w}")
        leaks += [Leak(**x) for x in c["leaks"]]
    digest = next(iter(certs.values()))["digest"] if certs else None
    typer.echo(f"certificate digest: {digest}")
    if leaks:
        fail("the contexts leak:\n" + "\n".join(f"  {x.message()}" for x in leaks))


def _write_report(out_dir: Path, results: dict, checkpoint: Path, db: Path, split: str) -> Path:
    """`evaluate --report`: the HTML report of one split's results, with the run's training curves when the
    checkpoint is a run directory (its `scalars.csv`)."""
    from confluence.evaluation.report import task_descriptions, write_report
    from confluence.store import Store

    store = Store.open(db)
    log = next((p / "scalars.csv" for p in (Path(checkpoint), *Path(checkpoint).parents[:3])
                if (p / "scalars.csv").is_file()), None)
    stypes = {t.name: int(t.target_stype) for t in store.tasks}
    notes = {"database": f"{store.name} ({store.num_rows:,} rows)", "checkpoint": str(checkpoint), "split": split}
    try:
        return write_report(out_dir, results, stypes, descriptions=task_descriptions(store), train_log=log,
                            title=f"Confluence report: {store.name}", notes=notes)
    except OSError as exc:
        fail(f"{out_dir}: the report cannot be written ({exc.strerror or exc})")


def predict_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", help="Trained run directory, its checkpoints/ folder, or one "
                                    "step_* checkpoint directory."),
    db: Path = typer.Option(..., "--db", help="Processed store to predict on (any store preprocessed with the "
                            "checkpoint's text encoder, not only the one it was trained on)."),
    task: str = typer.Option(..., "--task", help="Task of the store to predict (`confluence inspect STORE` lists "
                             "them); a link task needs a checkpoint with a link head (train-links)."),
    split: str = typer.Option("test", "--split", help="Predict every seed of this split: train | val | test "
                              "(ignored with --anchors)."),
    anchors: Path = typer.Option(None, "--anchors", help="Predict for these anchors instead: a .parquet or .csv file "
                                 "with the anchor table's primary-key column (or 'key') and an 'observation_time' "
                                 "column (every anchor needs a time, or --observation-time)."),
    observation_time: str = typer.Option(None, "--observation-time", metavar="row|latest|TIME",
                                         help="With --anchors: the time of anchors without one: 'row' (the anchor "
                                              "row's own time), 'latest' (no cut-off: the context may show the "
                                              "row's future) or an ISO 8601 time."),
    context_labels: str = typer.Option(None, "--context-labels", metavar="train|val|test|all",
                                       help="Whose labels a labelled context may show: those an evaluation of "
                                            "that split reads, or 'all' known at the observation time. Default: "
                                            "the --split's; 'all' with --anchors (as serve). The same anchor, "
                                            "time and labels give the same answer by every command."),
    out: Path = typer.Option(..., "-o", "--out", help="Output table: a .parquet or .csv file (written atomically)."),
    clip_numbers: bool = typer.Option(True, "--clip-numbers/--no-clip-numbers",
                                      help="Numbers within the train targets' range, rounded when they are all "
                                           "whole (--no-clip-numbers: the plain de-normalized number)."),
    top_k: int = typer.Option(None, "--top-k", help="Categorical tasks: also list the K most probable classes "
                              "(class_1, prob_1, ...; default 3, 0: none). Link tasks: the K target rows ranked "
                              "per anchor (default: the task's k)."),
    max_seeds: int = typer.Option(0, "--max-seeds", help="Predict at most this many seeds of the split, chosen "
                                  "deterministically (0: all)."),
    draws: int = typer.Option(DEFAULT_DRAWS, "--draws", min=1, help="Contexts drawn per seed, their answers combined "
                              "(probabilities averaged, numbers by median); 1: one context, the fastest."),
    batch_size: int = typer.Option(None, "--batch-size", help="Sequences per forward pass (default: the run's "
                                   "training batch size on a CPU, 65,536 cells' worth on a GPU)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Sampler threads building the input sequences "
                                "(default: 1 on a CPU, the CPUs less 2 on a GPU)."),
    blend: str = typer.Option(None, "--blend", metavar="gbdt", help="Also LightGBM's and the blend's columns "
                              "(gbdt_prediction, blend_prediction, ...) and the trivial baseline's (trivial_prediction, "
                              "...): LightGBM fitted on the train seeds, the "
                              "blend weight chosen on at most --max-seeds (0: 5,000) validation seeds (0, "
                              "LightGBM alone, unless a paired interval there shows another weight helps or LightGBM "
                              "no better than the trivial baseline); the trivial baseline ships where nothing is "
                              "shown better than it there."),
    certify: bool = typer.Option(False, "--certify", help="Also prove these predictions saw nothing from the "
                                 "future, on up to --certify-seeds anchors (as evaluate --certify); the certificate "
                                 "goes into the table's metadata (confluence.certificate) and a leak exits 1 naming it."),
    certify_seeds: int = typer.Option(200, "--certify-seeds", min=1, help="Anchors the certificate checks."),
    explain: int = typer.Option(0, "--explain", min=0, metavar="ROWS", help="Also say why: a column "
                                "'explanation' holding, per prediction, the ROWS context rows that moved it most "
                                "(table, key, time, effect) and the cells of the first three, as JSON; the "
                                "first one is printed. Costs one model call per context row and cell."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar / progress lines on stderr."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file that confluence did not "
                               "write (a Parquet file of an earlier predict is replaced without it)."),
) -> None:
    """Write a table of anchor key, observation time, prediction, p_null and the target type's extra columns
    (docs/design/evaluation.md); with --explain, why each prediction is what it is (docs/guide/README.md). For a
    link task: one row per anchor and rank with the target row's key and its score (docs/guide/serving.md)."""
    from confluence.errors import ConfluenceError
    from confluence.evaluation.blend import check_blend
    from confluence.evaluation.predict import blend_summary, predict, table_format
    from confluence.preprocess.progress import Reporter

    try:
        table_format(out)  # refuse an unknown output suffix before anything is loaded
        check_blend(blend)
        outputs.claim_file(out, force=force)
        from confluence.toolkit.compile_cache import use_compile_cache

        use_compile_cache()
        with Reporter(enabled=not no_progress) as rep:
            table = predict(checkpoint, db, task, split=split, anchors=anchors, out=out, batch_size=batch_size,
                            threads=threads, max_seeds=max_seeds or None, top_k=top_k, progress=rep,
                            clip_numbers=clip_numbers, draws=draws, context_labels=context_labels,
                            observation_time=observation_time, blend=blend,
                            blend_max_val=max_seeds or 5000, explain=explain,
                            certify=certify_seeds if certify else 0)
    except (ConfluenceError, OSError) as exc:
        fail(exc)
    from confluence.evaluation.link_predict import link_summary

    if (link := link_summary(table)) is not None:
        typer.echo(f"wrote the top {link['k']} {link['target_table']} rows of {link['anchors']} anchor(s) "
                   f"({table.num_rows} rows) to {out}")
        return
    typer.echo(f"wrote {table.num_rows} predictions to {out}")
    summary = blend_summary(table)
    if summary is not None:
        typer.echo(textwrap.fill(ship_text({"ship": summary["ship"], "validation": summary}), 78,
                                 subsequent_indent="  "))
    if explain and table.num_rows:
        from confluence.inference.explain import Explanation

        typer.echo("why the first one:\n" + Explanation.from_dict(json.loads(table.column("explanation")[0].as_py()))
                   .text())
    if certify:
        from confluence.evaluation.predict import certificate_of

        _print_certificate({task: {"certificate": certificate_of(table)}})


def baseline_cmd(
    db: Path = typer.Option(..., "--db", help="Processed store."),
    task: list[str] = typer.Option(None, "--task", metavar="TASK", help="Task (repeatable); default: every task."),
    split: str = typer.Option("test", "--split", help="train | val | test: the rows scored."),
    max_train: int = typer.Option(50_000, "--max-train", help="Train on at most this many seeds per task."),
    max_seeds: int = typer.Option(5000, "--max-seeds", help="Evaluate at most this many seeds per task (0: all)."),
    json_out: Path = typer.Option(None, "--json", help="Write the results as JSON here."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar / progress lines."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file that confluence did not "
                               "write (a Parquet file of an earlier predict is replaced without it)."),
) -> None:
    """LightGBM per task on relational features (anchor row, parents, time-bounded child aggregates); for a link
    task a LightGBM ranker over candidate rows beside the popularity and past-targets baselines."""
    from confluence.errors import ConfluenceError
    from confluence.evaluation.baselines import run_baselines
    from confluence.evaluation.evaluate import write_json
    from confluence.evaluation.links import run_link_baselines
    from confluence.store import Store
    from confluence.toolkit.progress import Reporter

    try:
        if json_out is not None:
            outputs.claim_file(json_out, force=force)
        store = Store.open(db)
        links = {t.name for t in store.link_tasks}
        cells = [t for t in task or [] if t not in links]
        results = {}
        if not task or cells:
            with Reporter(enabled=not no_progress) as rep:
                results = run_baselines(store, tasks=cells or None, split=split, max_train=max_train,
                                        max_seeds=max_seeds or None, progress=rep)
        link_results = {}
        if links and (not task or any(t in links for t in task)):
            with Reporter(enabled=not no_progress) as rep:
                link_results = run_link_baselines(store, tasks=[t for t in task or [] if t in links] or None,
                                                  split=split, max_seeds=max_seeds or None, gbdt=True,
                                                  max_train=max_train, progress=rep)
    except ConfluenceError as exc:
        fail(exc)
    if results:
        print_results(results, f"{db} — baselines, split {split}")
    if link_results:
        print_link_results(link_results, f"{db} — link tasks' baselines, split {split}")
    results = {**results, **link_results}
    if json_out:
        typer.echo(f"wrote {write_json(results, json_out)}")


def register(app: typer.Typer, bench_app: typer.Typer, text_app: typer.Typer) -> None:
    app.command("evaluate")(evaluate_cmd)
    app.command("predict")(predict_cmd)
    app.command("baseline")(baseline_cmd)
