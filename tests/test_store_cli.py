"""`confluence preprocess` / `confluence inspect` / the demo step runner."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from confluence.cli.demo_cmds import DemoContext, run_demo
from confluence.cli.main import app
from confluence.preprocess import pipeline
from tests.fixtures.bookstore import HashEncoder, bookstore_files


def test_preprocess_then_inspect(tmp_path, monkeypatch):
    src, meta = bookstore_files(tmp_path)
    monkeypatch.setattr(pipeline, "load_encoder", lambda spec: HashEncoder())
    out = tmp_path / "store"
    r = CliRunner().invoke(app, ["preprocess", str(src), "--metadata", str(meta), "--out", str(out), "--quiet",
                                 "--memory-limit-mb", "256", "--threads", "1"],
                            env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output and "orders_next_30d" in r.output
    r = CliRunner().invoke(app, ["inspect", str(out)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for text in ("bookstore", "customers", "orders.customer_id", "1 dangling", "order_status", "cell masking",
                 "derived", "k=2 null=1 [DE, FR]"):
        assert text in r.output, text
    narrow = CliRunner().invoke(app, ["inspect", str(out)], env={"COLUMNS": "80"})  # a terminal or a log
    assert narrow.exit_code == 0, narrow.output
    assert "…" not in narrow.output and max(len(line) for line in narrow.output.splitlines()) <= 80, narrow.output
    for text in ("orders.customer_id", "order_status (cell masking", "k=2 null=1 [DE, FR]"):
        assert text in narrow.output, text


def test_inspect_reports_errors_without_traceback(tmp_path):
    r = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert r.exit_code == 1
    assert "not a processed store" in r.output and "Traceback" not in r.output


def test_preprocess_bad_metadata_exits_1(tmp_path, monkeypatch):
    src, meta = bookstore_files(tmp_path)
    meta.write_text(meta.read_text().replace('"stype": "ignored"', '"stype": "nonsense"'))
    monkeypatch.setattr(pipeline, "load_encoder", lambda spec: HashEncoder())
    r = CliRunner().invoke(app, ["preprocess", str(src), "-m", str(meta), "-o", str(tmp_path / "s"), "-q"])
    assert r.exit_code == 1 and "unknown stype 'nonsense'" in r.output
    assert not (tmp_path / "s").exists()


def test_demo_runs_steps_in_order(tmp_path):
    seen: list[str] = []

    def first(ctx: DemoContext) -> None:
        seen.append("first")
        ctx.extra["x"] = 1

    def second(ctx: DemoContext) -> None:
        seen.append(f"second {ctx.extra['x']}")

    run_demo(DemoContext(out=Path(tmp_path), console=Console(file=open("/dev/null", "w"))),  # noqa: SIM115
             [("a", first), ("b", second)])
    assert seen == ["first", "second 1"]


def test_target_summary_formats():
    from confluence.store.inspect import target_summary
    from confluence.stypes import SemanticType

    ts = target_summary(SemanticType.TIMESTAMP, {"count": 2, "null_count": 0, "mean": 86_400e6 * 1.5,
                                                 "std": 86_400e6 * 0.5, "min": 86_400 * 10**6, "max": 2 * 86_400 * 10**6})
    assert ts == "n=2 null=0 mean=1970-01-02 12:00:00 std=0.5d min=1970-01-02 00:00:00 max=1970-01-03 00:00:00"
    assert target_summary(SemanticType.BOOLEAN, {"true_count": 1, "false_count": 2, "null_count": 0}) == \
        "true=1 false=2 null=0"
    cats = target_summary(SemanticType.CATEGORICAL, {"k": 7, "null_count": 0, "categories": list("abcdefg")})
    assert cats == "k=7 null=0 [a, b, c, d, e, ...]"
