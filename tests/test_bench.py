"""Every `confluence bench ...` command runs here at tiny sizes and writes what it measured; the kernel's GPU
path lowers for CUDA."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from typer.testing import CliRunner

from confluence.bench.attention import AttentionBenchConfig, run_attention_bench, speedups
from confluence.cli.main import app
from confluence.model.kernels import block_sparse_attention, synthetic_structure
from tests.fixtures.gpu import cuda_lowering
from tests.fixtures.model import tiny_run_config


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


def test_cli_bench_attention_times_each_launch_and_the_script_picks_one(tmp_path):
    """`--launch HxW` times the kernel per launch (named "kernel" for 1x4); `scripts/best_launch.py` reads the
    report; a bad launch is refused by name."""
    from scripts.best_launch import best_launch

    out = tmp_path / "bench.json"
    args = ["bench", "attention", "--seq-len", "48", "--batch-size", "1", "--heads", "2", "--head-dim", "16",
            "--block", "16", "--repeats", "1", "--kind", "column", "--impl", "kernel", "--no-train",
            "--launch", "1x4", "--launch", "2x8", "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert set(row["fwd_bwd_ms"]) == {"kernel", "kernel[h=2,w=8]"}, row["errors"]
    assert best_launch(report) in {(1, 4), (2, 8)}
    row["fwd_bwd_ms"]["kernel[h=2,w=8]"] = 0.0
    assert best_launch(report) == (2, 8)
    bad = CliRunner().invoke(app, ["bench", "attention", "--launch", "3x4", "--no-train"])
    assert bad.exit_code != 0 and "3x4" in bad.output


def test_cli_bench_attention_refuses_a_bad_perm_tile_by_name():
    from tests.fixtures.graphs import random_store

    store = random_store(1, n_tables=4, max_rows=40)
    res = CliRunner().invoke(app, ["bench", "attention", "--store", str(store.path), "--stats-only", "--no-train",
                                   "--perm-tile", "48"])
    assert res.exit_code != 0 and "perm_tile" in res.output and "Traceback" not in res.output


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

    with cuda_lowering():
        lowered = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, q, q).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    # row kinds compile an unrolled and a dynamic word-loop variant of each kernel (lax.cond picks one)
    assert text.count("custom_call @__gpu$xla.gpu.triton") == (3 if kind == "column" else 6)
    for name in ("fwd", "dq", "dkv"):
        assert f'name = "block_sparse_{name}_{kind}"' in text


def test_gpu_path_lowers_with_several_heads_per_program():
    """Four heads per program and eight warps (`model.kernel_heads` / `kernel_warps`) pass the Triton lowering."""
    struct = tuple(jnp.asarray(x) for x in synthetic_structure(0, "outbound", 2, 100))
    q = jnp.zeros((2, 100, 8, 32), jnp.bfloat16)

    def loss(q, k, v):
        out = block_sparse_attention(q, k, v, "outbound", *struct, block=64, interpret=False, heads=4, warps=8)
        return jnp.sum(out.astype(jnp.float32))

    with cuda_lowering():
        lowered = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, q, q).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert text.count("custom_call @__gpu$xla.gpu.triton") == 6
    assert "num_warps = 8" in text


@pytest.mark.parametrize("kind", ["outbound", "column"])
def test_model_launch_compiles_one_word_loop_variant(kind):
    """The model's kernel (`block_sparse()`: rows contiguous) lowers three Triton kernels per kind, not six: no
    dynamic word-loop variant and no `lax.cond` between them."""
    from confluence.model.kernels import block_sparse

    attention = block_sparse(interpret=False)  # compiled, as on a GPU
    struct = tuple(jnp.asarray(x) for x in synthetic_structure(0, kind, 2, 100))
    q = jnp.zeros((2, 100, 2, 32), jnp.bfloat16)

    def loss(q, k, v):
        st = attention.prepare(kind, *struct)
        return jnp.sum(attention.attend(q, k, v, kind, st).astype(jnp.float32))

    with cuda_lowering():
        text = jax.jit(jax.grad(loss, (0, 1, 2))).trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("custom_call @__gpu$xla.gpu.triton") == 3


def test_end_to_end_training_compares_both_attention_impls(monkeypatch):
    import confluence.bench.train as bench
    from confluence.cli import bench_cmds

    calls = []

    def fake(preset, impl, steps):
        calls.append((preset, impl, steps))
        cells = {"reference": 1000.0, "block_sparse": 2500.0}[impl]
        return {"cells_per_s": cells, "real_cells_per_s": cells, "step_s": 1.0, "compile_s": 0.0}

    monkeypatch.setattr(bench, "train_throughput", fake)
    out = bench_cmds._end_to_end_training("base", 3)
    assert calls == [("base", "reference", 3), ("base", "block_sparse", 3)]
    assert out["available"] and out["speedup"] == 2.5


def test_bench_text_encoder_small(tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, ["bench", "text-encoder", "--n", "2000", "--repeats", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    figures = json.loads(out.read_text())
    assert figures["n_strings"] == 2000 and 3 <= figures["words_min"] <= figures["words_max"] <= 8
    for key in ("static_1_threads", "static_2_threads", "model2vec_encode_1_thread", "cached_cold", "cached_warm"):
        assert figures[key]["best"] > 0 and figures[key]["per_cpu_s"] > 0
    assert figures["cache_file_bytes"] > 2000 * 256 * 2
    assert "strings/s" in res.output


def test_bench_sampler_reads_the_training_stream(tiny_store, tmp_path):
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", "sampler", "--db", str(tiny_store), "--set", "sampler.batch_size=4",
                                 "--set", "sampler.seq_len=64", "--threads", "1", "--threads", "2", "--batches", "3",
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "speed-up 2 vs 1 threads" in r.output
    res = json.loads(out.read_text())
    for one in (res["1"], res["2"]):
        assert {"sequences_per_s", "cells_per_s", "slots_per_s", "phases"} <= set(one)
        assert set(one["phases"]) == {"walk", "linearize", "permutations", "text", "collation"}
        assert one["slots_per_s"] >= one["cells_per_s"] > 0 and one["config"]["batch_size"] == 4
    r = CliRunner().invoke(app, ["bench", "sampler", "--db", str(tiny_store), "--config", "demo", "--batches", "2"])
    assert r.exit_code == 0 and "S=128" in r.output, r.output  # the demo recipe's sampler settings


@pytest.mark.slow
def test_bench_train_writes_figures(tmp_path):
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(json.dumps(tiny_run_config().to_dict()))
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", "train", "--config", str(cfg_file), "--steps", "2", "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["step_s"] > 0 and d["cells_per_s"] > 0 and 0 < d["mfu"] < 1
    assert d["batch_size"] == 4 and d["seq_len"] == 32


def test_train_throughput_skips_the_base_recipe_off_gpu():
    from confluence.bench.train import train_throughput

    if jax.default_backend() == "gpu":
        pytest.skip("GPU backend: the benchmark would run")
    assert "skipped" in train_throughput("base", "reference")


def test_trace_summary_sums_operations_by_kind_and_shape():
    from confluence.bench.profile import instruction_shapes, summarize_trace

    hlo = """ENTRY %main {
  %ynn_fusion.3 = f32[16,4,128,128]{3,2,1,0} fusion(%a, %b), kind=kCustom
  %ynn_fusion.12 = f32[2048,64]{1,0} fusion(%c, %d), kind=kCustom
  ROOT %divide_convert_fusion = bf16[16,128,64]{2,1,0} fusion(%e), kind=kLoop
}"""
    shapes = instruction_shapes(hlo)
    assert shapes == {"ynn_fusion.3": "f32[16,4,128,128]{3,2,1,0}", "ynn_fusion.12": "f32[2048,64]{1,0}",
                      "divide_convert_fusion": "bf16[16,128,64]{2,1,0}"}
    events = [
        {"ph": "X", "name": "ynn_fusion.3", "dur": 3000}, {"ph": "X", "name": "ynn_fusion.3", "dur": 1000},
        {"ph": "X", "name": "ynn_fusion.12", "dur": 2000},
        {"ph": "X", "name": "kernel_17", "dur": 500, "args": {"hlo_op": "divide_convert_fusion"}},  # a GPU kernel
        {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 99000},  # not an operation of the module
        {"ph": "i", "name": "ynn_fusion.12", "dur": 7000},  # not a complete event
    ]
    total, by_kind, by_shape = summarize_trace(events, shapes, steps=2)
    assert total == pytest.approx(3.25)
    assert [(g.name, g.ms_per_step, g.ops_per_step) for g in by_kind] == [
        ("ynn_fusion", 3.0, 1.5), ("divide_convert_fusion", 0.25, 0.5)]
    assert [g.name for g in by_shape] == ["f32[16,4,128,128]{3,2,1,0}", "f32[2048,64]{1,0}", "bf16[16,128,64]{2,1,0}"]


@pytest.mark.slow
def test_bench_train_profile_traces_the_step(tmp_path):
    cfg_file = tmp_path / "tiny.json"
    cfg_file.write_text(json.dumps(tiny_run_config().to_dict()))
    out, prof = tmp_path / "bench.json", tmp_path / "prof"
    r = CliRunner().invoke(app, ["bench", "train", "--config", str(cfg_file), "--steps", "2", "--json", str(out),
                                 "--profile", str(prof)])
    assert r.exit_code == 0, r.output
    p = json.loads(out.read_text())["profile"]
    assert p["steps"] == 10 and p["wall_ms_per_step"] > 0 and p["op_ms_per_step"] > 0
    kinds = {g["name"] for g in p["by_kind"]}
    assert kinds and all(not k[-1].isdigit() for k in kinds)  # numbers stripped
    assert all("[" in g["name"] for g in p["by_shape"])
    assert sum(g["ms_per_step"] for g in p["by_kind"]) == pytest.approx(p["op_ms_per_step"])
    assert list(prof.glob("**/*.trace.json.gz")) and (prof / "step.hlo.txt").exists()
    assert "by output shape:" in r.output
