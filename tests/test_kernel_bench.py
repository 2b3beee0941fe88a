"""`confluence bench attention` runs on CPU (tiny sizes) and writes a complete report; the GPU path lowers."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from typer.testing import CliRunner

from confluence.cli.main import app
from confluence.model.kernels import block_sparse_attention, synthetic_structure
from confluence.model.kernels.bench import AttentionBenchConfig, run_attention_bench, speedups


@pytest.mark.slow
def test_cli_bench_attention_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "attention", "--seq-len", "80", "--batch-size", "1", "--heads", "1", "--head-dim", "16"]
    args += ["--block", "32", "--repeats", "1", "--no-train", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "outbound" in result.output
    report = json.loads(out.read_text())
    assert report["backend"] == jax.default_backend()
    assert report["kernel_mode"] == ("compiled" if jax.default_backend() == "gpu" else "interpret")
    assert [(r["seq_len"], r["kind"]) for r in report["rows"]] == [
        (80, "outbound"),
        (80, "inbound"),
        (80, "column"),
    ]
    for row in report["rows"]:
        assert {"kernel", "reference", "dense"} <= set(row["fwd_bwd_ms"]), row["errors"]
        assert all(ms > 0 for ms in row["fwd_ms"].values())
        assert 0 < row["tiles"]["nonempty"] <= row["tiles"]["tiles"] == 9
    assert report["end_to_end_training"]["available"] is False


def test_cli_rejects_unknown_kind():
    result = CliRunner().invoke(app, ["bench", "attention", "--kind", "sideways", "--no-train"])
    assert result.exit_code != 0
    assert "sideways" in result.output


def test_bench_function_reports_speedups_per_kind():
    cfg = AttentionBenchConfig(
        seq_lens=(48,), batch_size=1, heads=1, head_dim=16, block=16, repeats=1, kinds=("column",),
        implementations=("kernel", "reference"),
    )  # fmt: skip
    report = run_attention_bench(cfg, log=lambda _: None)
    assert set(speedups(report, "reference")) == {(48, "column")}


@pytest.mark.parametrize("kind", ["outbound", "inbound", "column"])
def test_gpu_path_lowers_to_triton(kind):
    """Cross-platform lowering for CUDA on this CPU machine: the kernels are accepted by the Triton lowering."""
    struct = tuple(jnp.asarray(x) for x in synthetic_structure(0, kind, 2, 100))
    q = jnp.zeros((2, 100, 2, 32), jnp.bfloat16)

    def loss(q, k, v):
        out = block_sparse_attention(q, k, v, kind, *struct, block=64, interpret=False)
        return jnp.sum(out.astype(jnp.float32))

    lowered = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, q, q).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    # row kinds compile an unrolled and a dynamic word-loop variant of each kernel (lax.cond picks one)
    assert text.count("custom_call @__gpu$xla.gpu.triton") == (3 if kind == "column" else 6)
    for name in ("fwd", "dq", "dkv"):
        assert f'name = "block_sparse_{name}_{kind}"' in text


def test_end_to_end_training_compares_both_attention_impls(monkeypatch):
    import confluence.model.kernels.bench as bench
    from confluence.cli import kernel_cmds

    calls = []

    def fake(preset, impl, steps):
        calls.append((preset, impl, steps))
        cells = {"reference": 1000.0, "block_sparse": 2500.0}[impl]
        return {"cells_per_s": cells, "real_cells_per_s": cells, "step_s": 1.0, "compile_s": 0.0}

    monkeypatch.setattr(bench, "train_throughput", fake)
    out = kernel_cmds._end_to_end_training("base", 3)
    assert calls == [("base", "reference", 3), ("base", "block_sparse", 3)]
    assert out["available"] and out["speedup"] == 2.5
