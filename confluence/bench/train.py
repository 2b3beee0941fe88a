"""`confluence bench train`: step time, cells/s and model FLOP utilisation of forward + backward + update, on
synthetic batches of a recipe's shapes (no store needed)."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, replace

import jax
import jax.numpy as jnp

from confluence.bench.synthetic import SyntheticDatabase
from confluence.model.config import ModelConfig
from confluence.model.inputs import DbTables, batch_to_inputs
from confluence.model.transformer import RelationalTransformer, count_params
from confluence.toolkit.memory import check_fits
from confluence.toolkit.mesh import make_mesh, replicate
from confluence.training.config import RunConfig, load_config
from confluence.training.step import get_trainer, shard_inputs

# Dense BF16 tensor-core peaks (no sparsity), FLOP/s, by substring of `device.device_kind`.
GPU_PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10": 125e12}


def model_flops_per_step(cfg: ModelConfig, batch: int, seq: int, max_k: int) -> float:
    """Analytic matmul FLOPs of forward + backward (3x forward) with the dense reference attention."""
    d, f, n = cfg.d_model, cfg.d_ff, cfg.n_layers
    per_tok_layer = 3 * (2 * 5 * d * d + 2 * 2 * seq * d) + 2 * 3 * d * f  # Q,K,V,O,gate + QK^T,PV + SwiGLU
    per_tok_edge = 2 * d * (1 + cfg.d_time) + 2 * d * (3 + cfg.d_time + d)  # numerical/timestamp encoders + heads
    fwd = batch * seq * (n * per_tok_layer + per_tok_edge) + 2 * batch * max_k * d
    return 3.0 * fwd


def measured_matmul_peak(dtype=jnp.float32, n: int = 1024, reps: int = 5) -> float:
    """Achieved FLOP/s of a square matmul on the default device (the CPU "peak" the MFU is relative to)."""
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    t = time.perf_counter()
    for _ in range(reps):
        r = f(a)
    r.block_until_ready()
    return 2 * n**3 * reps / (time.perf_counter() - t)


@dataclass
class BenchResult:
    recipe: str
    device: str
    num_devices: int
    batch_size: int
    seq_len: int
    params: int
    compile_s: float  # lowering + XLA compilation of the fused train step
    first_step_s: float  # first call (includes any compilation the jit cache did not reuse)
    step_s: float  # median over the timed windows of the mean step time in a window
    step_s_best: float  # the fastest window's mean step time
    windows: int
    steps_per_s: float
    cells_per_s: float  # padded slots B*S per second
    real_cells_per_s: float  # non-padding cells per second
    model_flops_per_step: float
    xla_flops_per_step: float | None
    peak_flops: float
    peak_source: str
    mfu: float
    compute_dtype: str
    attention_impl: str
    breakdown: dict | None = None  # see `step_breakdown`


class StepBench:
    """A recipe's trainer, replicated state and one synthetic batch per target type, ready to time."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.mesh = mesh = make_mesh()
        s = cfg.sampler
        db = SyntheticDatabase(seed=cfg.seed, d_t=cfg.model.d_t, name="synthetic0")
        self.model = RelationalTransformer(cfg.model, key=jax.random.key(cfg.seed))
        # the process's trainer for this configuration (training.step.get_trainer): a second bench of the same
        # recipe in one process (the breakdown, --profile) reuses its compiled steps instead of compiling again
        self.trainer = get_trainer(cfg.model, cfg.optim.for_run(cfg.steps_or(1000)), cfg.loss)
        params, opt_state = self.trainer.init_state(self.model)
        self.state = [replicate(params, mesh), replicate(opt_state, mesh)]
        tb = DbTables.build(db.name, db.column_embeddings, db.categorical_embeddings, db.max_k, cfg.loss.max_k)
        self.tabs = replicate((tb.column_embeddings, tb.categorical_embeddings), mesh)
        batches = [db.batch(t, s.batch_size, s.seq_len, s.max_rows, seed=(0, 0, 0)) for t in range(len(db.tasks))]
        self.inputs = [shard_inputs(batch_to_inputs(b), mesh) for b in batches]
        self.real = sum(int((~b.is_padding).sum()) for b in batches) / len(batches)
        self.n = 0

    def step(self) -> jax.Array:
        params, opt_state, m = self.trainer.step(*self.state, [(self.inputs[self.n % len(self.inputs)], *self.tabs)],
                                                 self.n)
        self.state = [params, opt_state]
        self.n += 1
        return m.loss


def _windows(fn, steps: int, windows: int) -> list[float]:
    """Mean seconds per call of `fn` in each of `windows` windows of `steps` calls (after one warm call)."""
    jax.block_until_ready(fn())
    out = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(steps):
            r = fn()
        jax.block_until_ready(r)
        out.append((time.perf_counter() - t0) / steps)
    return out


def bench_train(cfg: RunConfig, recipe: str, steps: int = 5, peak_flops: float | None = None, windows: int = 1,
                breakdown: bool = False) -> BenchResult:
    """Compile the fused train step of `cfg`, then time `windows` windows of `steps` steps over one synthetic batch
    per target type (the median window is the figure: these machines are noisy). `breakdown` adds
    `step_breakdown`'s figures."""
    b = StepBench(cfg)
    s = cfg.sampler
    xla_flops = None
    t0 = time.perf_counter()
    compiled = b.trainer._step.lower(*b.state, b.inputs[0], *b.tabs).compile()
    compile_s = time.perf_counter() - t0
    check_fits(compiled, f"the training step of recipe {recipe!r} ({s.batch_size} sequences of {s.seq_len} cells)",
               "lower sampler.batch_size or sampler.seq_len (--set sampler.batch_size=...), or use a device with "
               "more memory")
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        xla_flops = float(cost.get("flops")) if cost and cost.get("flops") is not None else None
    except Exception:  # cost analysis is optional and backend-dependent
        xla_flops = None
    t0 = time.perf_counter()
    jax.block_until_ready(b.step())
    first_step_s = time.perf_counter() - t0
    times = _windows(b.step, steps, max(1, windows))
    step_s = statistics.median(times)

    dev = jax.devices()[0]
    if peak_flops is not None:
        peak, source = peak_flops, "given (--peak-tflops)"
    elif dev.platform == "gpu":
        peak = next((v for k, v in GPU_PEAKS.items() if k in dev.device_kind), 989e12)
        source = f"dense BF16 spec sheet of {dev.device_kind}"
    else:
        peak = measured_matmul_peak() * len(jax.devices())
        source = "measured 1024x1024 float32 matmul on this CPU"
    flops = model_flops_per_step(cfg.model, s.batch_size, s.seq_len, cfg.loss.max_k)
    return BenchResult(
        recipe=recipe, device=f"{dev.platform}:{dev.device_kind}", num_devices=len(jax.devices()),
        batch_size=s.batch_size, seq_len=s.seq_len, params=count_params(b.model), compile_s=compile_s,
        first_step_s=first_step_s, step_s=step_s, step_s_best=min(times), windows=len(times),
        steps_per_s=1.0 / step_s, cells_per_s=s.batch_size * s.seq_len / step_s,
        real_cells_per_s=b.real / step_s, model_flops_per_step=flops, xla_flops_per_step=xla_flops,
        peak_flops=peak, peak_source=source, mfu=flops / step_s / peak, compute_dtype=cfg.model.compute_dtype,
        attention_impl=cfg.model.attention_impl,
        breakdown=step_breakdown(cfg, steps=steps, windows=max(3, windows)) if breakdown else None,
    )


def _parts(cfg: RunConfig, steps: int, windows: int) -> dict[str, float]:
    """Median ms of forward + loss, forward + backward, optimizer update and the fused step, first batch."""
    b = StepBench(cfg)
    tr, inp, tabs = b.trainer, b.inputs[0], b.tabs
    grads, _ = tr._grad(b.state[0], inp, *tabs)

    def update():
        params, opt_state, norm = tr._apply(*b.state, grads)
        b.state = [params, opt_state]
        return norm

    def fused():
        params, opt_state, m = tr._step(*b.state, inp, *tabs)
        b.state = [params, opt_state]
        return m[0]

    fns = {"forward_loss_ms": lambda: tr._eval(b.state[0], inp, *tabs)[0],
           "forward_backward_ms": lambda: tr._grad(b.state[0], inp, *tabs)[1].loss,
           "update_ms": update, "step_ms": fused}
    return {k: 1e3 * statistics.median(_windows(f, steps, windows)) for k, f in fns.items()}


def step_breakdown(cfg: RunConfig, steps: int = 5, windows: int = 3) -> dict:
    """Where a train step's time goes (the method of the training-speed issue): forward + loss, forward +
    backward, optimizer update and the fused step, timed separately, for the recipe's N layers and for 1 layer;
    the differences give the cost per layer and the cost outside the layers (value encoding, heads, loss)."""
    n = cfg.model.n_layers
    full = _parts(cfg, steps, windows)
    out = {f"layers_{n}": full}
    if n > 1:
        one = _parts(replace(cfg, model=replace(cfg.model, n_layers=1)), steps, windows)
        out["layers_1"] = one
        for k in ("forward_loss_ms", "forward_backward_ms", "update_ms"):
            per_layer = (full[k] - one[k]) / (n - 1)
            out.setdefault("per_layer", {})[k] = per_layer
            out.setdefault("outside_layers", {})[k] = one[k] - per_layer
    return out


def result_dict(r: BenchResult) -> dict:
    return asdict(r)


def train_throughput(recipe: str = "base", attention_impl: str = "reference", steps: int = 5,
                     allow_cpu: bool = False) -> dict:
    """End-to-end training throughput (forward + backward + update) of a recipe with the given attention
    implementation: the figures of `confluence bench train` (and the end-to-end part of `bench attention`).

    Off a GPU it returns `{"skipped": reason}` unless `allow_cpu` (the `base` recipe at B=32, S=1024 with dense
    reference attention needs tens of GB and minutes per step on a CPU)."""
    if jax.default_backend() != "gpu" and not allow_cpu:
        return {"skipped": f"no GPU (backend {jax.default_backend()!r}); use `confluence bench train --config small` "
                           "on CPU or pass allow_cpu=True"}
    cfg = load_config(recipe, {"model": {"attention_impl": attention_impl}})
    return result_dict(bench_train(cfg, recipe, steps=steps, windows=3))
