"""LeJEPA text training: Muon + AdamW, gradient accumulation, data parallelism over a device mesh, checkpoints.

Data parallelism: a 1-D `jax.sharding.Mesh` with axis "data"; the per-device loss and gradients run under
`jax.shard_map` and are averaged with `lax.pmean` over "data" (SIGReg sums its characteristic function over the
axis, so it sees the global batch). Parameters and optimizer state are replicated.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from confluence.errors import ConfluenceError
from confluence.textmodel.config import TrainConfig
from confluence.textmodel.data import (
    TOKENIZER_FILE,
    MMapTokenDataset,
    iter_text_batches,
    num_batches,
    prefetch,
    strip_eos,
)
from confluence.textmodel.losses import sigreg_key
from confluence.textmodel.model import TextTransformer, cast_params
from confluence.textmodel.objective import BATCH_KEYS, compute_losses, host_batch, metric_names
from confluence.textmodel.views import make_views, view_seed

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
FLOAT16_LOSS_SCALE = 1024.0
CKPT_DIR = "checkpoints"

# ---------------------------------------------------------------------------------------------- optimizer


def param_labels(params: Any) -> Any:
    """'adamw' for token embeddings, mask-position embeddings, norm scales, the PoPE phase bias and any non-2-D
    array; 'muon' for every other 2-D matrix."""
    def label(path: tuple, x: Any) -> str:
        names = [str(getattr(p, "name", getattr(p, "key", p))) for p in path]
        if x.ndim != 2 or any(n in ("embed", "mask_pos_emb", "scale", "pope_delta") for n in names):
            return "adamw"
        return "muon"

    return jax.tree_util.tree_map_with_path(label, params)


def _decay_mask(params: Any) -> Any:
    def f(path: tuple, x: Any) -> bool:
        names = [str(getattr(p, "name", getattr(p, "key", p))) for p in path]
        return x.ndim == 2 and not any(n in ("scale", "pope_delta") for n in names)

    return jax.tree_util.tree_map_with_path(f, params)


def _muon_dims(updates: Any) -> Any:
    # Dense weights are [in, out]: reduce over axis 0, output axis 1.
    return jax.tree.map(lambda _: optax.contrib.MuonDimensionNumbers(reduction_axis=0, output_axis=1), updates)


def make_schedule(peak: float, warmup: int, total: int) -> optax.Schedule:
    """Linear warmup to `peak`, then cosine decay to 10 % of it at `total` steps."""
    warmup = max(1, min(warmup, max(total - 1, 1)))
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(total, warmup + 1), end_value=0.1 * peak)


def make_optimizer(cfg: TrainConfig, total_steps: int, params: Any) -> optax.GradientTransformation:
    """MuonWithAdamWFallback: Muon for 2-D matrices, AdamW for embeddings / norms / PoPE delta; global-norm clip."""
    muon = optax.chain(
        optax.contrib.scale_by_muon(beta=0.95, weight_dimension_numbers=_muon_dims),
        optax.add_decayed_weights(cfg.weight_decay),
        optax.scale_by_learning_rate(make_schedule(cfg.lr_muon, cfg.warmup_steps, total_steps)),
    )
    adamw = optax.adamw(make_schedule(cfg.lr_adam, cfg.warmup_steps, total_steps), b1=cfg.adam_b1,
                        b2=cfg.adam_b2, eps=1e-8, weight_decay=cfg.weight_decay, mask=_decay_mask)
    return optax.chain(
        optax.clip_by_global_norm(cfg.grad_clip),
        optax.multi_transform({"muon": muon, "adamw": adamw}, param_labels(params)),
    )


# ---------------------------------------------------------------------------------------------- the step


@dataclass
class SpecialIds:
    pad_id: int
    mask_id: int
    bos_id: int
    eos_id: int


def make_mesh(num_devices: int | None = None) -> Mesh:
    """A 1-D mesh named "data" over the first `num_devices` local devices (all by default)."""
    devs = jax.local_devices()
    n = len(devs) if num_devices is None else num_devices
    if not 1 <= n <= len(devs):
        raise ConfluenceError(f"asked for {n} devices, {len(devs)} local device(s) available")
    return Mesh(np.array(devs[:n]), ("data",))


def build_train_step(cfg: TrainConfig, static: Any, opt: optax.GradientTransformation, ids: SpecialIds,
                     mesh: Mesh) -> Callable[..., Any]:
    """jit-compiled (params, opt_state, batch, step) -> (params, opt_state, metrics).

    `batch` arrays are [grad_accum, global_batch, ...], sharded over "data" on axis 1.
    """
    dtype = DTYPES[cfg.compute_dtype]
    scale = FLOAT16_LOSS_SCALE if cfg.compute_dtype == "float16" else 1.0
    names = metric_names(cfg)

    def micro_loss(params: Any, mb: dict[str, jax.Array], step: jax.Array, micro: int) -> tuple[jax.Array, Any]:
        model = eqx.combine(cast_params(params, dtype), static)
        skey = sigreg_key(cfg.seed, step * cfg.grad_accum + micro)
        dkey = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 1), step), micro)
        dkey = jax.random.fold_in(dkey, jax.lax.axis_index("data"))
        total, m = compute_losses(model, mb, cfg, pad_id=ids.pad_id, mask_id=ids.mask_id, bos_id=ids.bos_id,
                                  eos_id=ids.eos_id, sigreg_key=skey,
                                  key=dkey if cfg.model.drop_path_rate > 0 else None, axis_name="data")
        return total * scale, {k: m[k] for k in names}

    def local(params: Any, batch: dict[str, jax.Array], step: jax.Array) -> tuple[Any, Any]:
        grad_fn = jax.grad(micro_loss, has_aux=True)
        zeros = jax.tree.map(jnp.zeros_like, params)
        g_acc, m_acc = zeros, {k: jnp.zeros((), jnp.float32) for k in names}
        for i in range(cfg.grad_accum):  # unrolled: grad_accum is small; keeps the micro index static
            mb = {k: v[i] for k, v in batch.items()}
            g, m = grad_fn(params, mb, step, i)
            g_acc = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g)
            m_acc = {k: m_acc[k] + m[k] for k in names}
        g_acc = jax.tree.map(lambda a: a / (cfg.grad_accum * scale), g_acc)
        m_acc = {k: v / cfg.grad_accum for k, v in m_acc.items()}
        return jax.lax.pmean((g_acc, m_acc), "data")

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "data"), P()), out_specs=(P(), P()),
                            check_vma=False)

    @partial(jax.jit, donate_argnums=(0, 1))
    def step_fn(params: Any, opt_state: Any, batch: dict[str, jax.Array], step: jax.Array) -> Any:
        grads, metrics = sharded(params, batch, step)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return params, opt_state, metrics

    return step_fn


# ---------------------------------------------------------------------------------------------- checkpoints


def _step_dir(run: Path, step: int) -> Path:
    return run / CKPT_DIR / f"step_{step:08d}"


def latest_checkpoint(run: str | Path) -> Path | None:
    """The newest complete checkpoint directory of a run, or None."""
    d = Path(run) / CKPT_DIR
    if not d.is_dir():
        return None
    steps = sorted(p for p in d.iterdir() if p.name.startswith("step_") and (p / "state.json").is_file())
    return steps[-1] if steps else None


def save_checkpoint(run: Path, step: int, params: Any, opt_state: Any, state: dict[str, Any]) -> Path:
    """Write params, optimizer state, loop state, the run configuration and the tokenizer atomically to
    run/checkpoints/step_<step>/ (a checkpoint directory is self-contained)."""
    final = _step_dir(run, step)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(run / "config.json", tmp / "config.json")
    shutil.copyfile(run / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
    eqx.tree_serialise_leaves(tmp / "params.eqx", jax.device_get(params))
    eqx.tree_serialise_leaves(tmp / "opt_state.eqx", jax.device_get(opt_state))
    (tmp / "state.json").write_text(json.dumps(state | {"step": step}, indent=2), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def load_run_config(run: str | Path) -> TrainConfig:
    """The TrainConfig saved in a run directory."""
    path = Path(run) / "config.json"
    try:
        return TrainConfig.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ConfluenceError(f"{run}: no config.json; not a text-model run directory") from None
    except json.JSONDecodeError as exc:
        raise ConfluenceError(f"{path}: not valid JSON ({exc})") from None


def load_params(ckpt: Path, cfg: TrainConfig) -> tuple[Any, Any]:
    """(params, static) of the model in checkpoint directory `ckpt`."""
    template = TextTransformer(cfg.model, jax.random.PRNGKey(0))
    params, static = eqx.partition(template, eqx.is_array)
    try:
        params = eqx.tree_deserialise_leaves(ckpt / "params.eqx", params)
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfluenceError(f"{ckpt}: cannot read params.eqx ({exc})") from None
    return params, static


# ---------------------------------------------------------------------------------------------- the loop


_STEP_CACHE: dict[tuple, Callable[..., Any]] = {}


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    metrics: list[dict[str, float]]
    seconds: float


def train(data_dir: str | Path, run_dir: str | Path, cfg: TrainConfig, *, resume: bool = True,
          progress: Callable[[dict[str, float]], None] | None = None, stop_after: int | None = None) -> TrainResult:
    """Train (or resume) a LeJEPA text model on prepared data; one epoch or `cfg.max_train_steps` steps.

    Writes run_dir/config.json, tokenizer.json, data_meta.json, metrics.csv and checkpoints/step_*/ every
    `checkpoint_every` steps and at the end. With `resume`, continues from the newest checkpoint exactly where
    it stopped (same batches, same views, same schedule position). `stop_after` ends the call after that global
    step (with a checkpoint), as if the process had been stopped there.
    """
    cfg.check()
    ds = MMapTokenDataset(data_dir)
    meta = ds.meta
    if cfg.model.vocab_size != meta.vocab_size or cfg.model.max_seq_len != meta.max_seq_len:
        raise ConfluenceError(
            f"model vocab/length ({cfg.model.vocab_size}, {cfg.model.max_seq_len}) do not match the data in "
            f"{data_dir} ({meta.vocab_size}, {meta.max_seq_len})"
        )
    mesh = make_mesh(cfg.num_devices)
    n_dev = mesh.devices.size
    if cfg.batch_size % n_dev:
        raise ConfluenceError(f"batch_size {cfg.batch_size} is not divisible by the {n_dev} devices of the mesh")
    host_bs = cfg.batch_size * cfg.grad_accum
    epoch_steps = num_batches(ds, host_bs)
    if epoch_steps < 1:
        raise ConfluenceError(f"{data_dir}: {len(ds)} samples is fewer than one step's {host_bs}")
    total_steps = min(epoch_steps, cfg.max_train_steps) if cfg.max_train_steps else epoch_steps

    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    cfg_json = cfg.to_json()
    ckpt = latest_checkpoint(run) if resume else None
    if ckpt is not None:
        saved = json.loads((run / "config.json").read_text(encoding="utf-8"))
        if {k: v for k, v in saved.items() if k != "max_train_steps"} != {
            k: v for k, v in cfg_json.items() if k != "max_train_steps"
        }:
            raise ConfluenceError(f"{run}: holds a run with another configuration; use a new --out to start afresh")
    elif latest_checkpoint(run) is not None:
        raise ConfluenceError(f"{run}: already holds checkpoints; resume it or choose a new --out")
    (run / "config.json").write_text(json.dumps(cfg_json, indent=2), encoding="utf-8")
    shutil.copyfile(Path(data_dir) / TOKENIZER_FILE, run / TOKENIZER_FILE)
    (run / "data_meta.json").write_text(json.dumps(meta.to_json(), indent=2), encoding="utf-8")

    model = TextTransformer(cfg.model, jax.random.PRNGKey(cfg.seed))
    params, static = eqx.partition(model, eqx.is_array)
    opt = make_optimizer(cfg, total_steps, params)
    opt_state = opt.init(params)
    start = 0
    if ckpt is not None:
        params = eqx.tree_deserialise_leaves(ckpt / "params.eqx", params)
        opt_state = eqx.tree_deserialise_leaves(ckpt / "opt_state.eqx", opt_state)
        start = json.loads((ckpt / "state.json").read_text(encoding="utf-8"))["step"]

    rep = NamedSharding(mesh, P())
    params, opt_state = jax.device_put((params, opt_state), rep)
    ids = SpecialIds(meta.pad_id, meta.mask_id, meta.bos_id, meta.eos_id)
    cache_key = (cfg.replace(max_train_steps=None), total_steps, astuple(ids), tuple(mesh.devices.flat))
    if cache_key not in _STEP_CACHE:  # one compiled step per configuration and process
        _STEP_CACHE[cache_key] = build_train_step(cfg, static, opt, ids, mesh)
    step_fn = _STEP_CACHE[cache_key]
    bsh = NamedSharding(mesh, P(None, "data"))
    names = metric_names(cfg) + ["grad_norm"]

    def batches() -> Any:
        it = iter_text_batches(ds, host_bs, seed=cfg.seed, buffer_size=cfg.shuffle_buffer, start_batch=start)
        for s, raw in enumerate(it, start=start):
            if s >= total_steps:
                return
            toks = strip_eos(raw, meta.eos_id, meta.pad_id)
            micro = []
            for i in range(cfg.grad_accum):
                t = toks[i * cfg.batch_size : (i + 1) * cfg.batch_size]
                micro.append(host_batch(t, make_views(t, meta.pad_id, cfg.views, view_seed(cfg.seed, s, i))))
            stacked = {k: np.stack([m[k] for m in micro]) for k in BATCH_KEYS}
            yield s, jax.device_put(stacked, bsh)

    metrics_path = run / "metrics.csv"
    rows = _read_metrics(metrics_path, upto=start)
    history: list[dict[str, float]] = []
    t0 = time.perf_counter()
    step = start
    with open(metrics_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["step", *names, "seconds"])
        w.writeheader()
        for r in rows:
            w.writerow(r)
        for step_idx, batch in prefetch(batches(), size=2):
            params, opt_state, m = step_fn(params, opt_state, batch, jnp.asarray(step_idx, jnp.int32))
            step = step_idx + 1
            if step % cfg.log_every == 0 or step == total_steps or step == start + 1:
                vals = {k: float(v) for k, v in jax.device_get(m).items()}
                row = {"step": step, **{k: vals[k] for k in names}, "seconds": round(time.perf_counter() - t0, 3)}
                w.writerow(row)
                fh.flush()
                history.append(row)
                if progress is not None:
                    progress(row)
            stopping = stop_after is not None and step >= stop_after
            if step % cfg.checkpoint_every == 0 or step == total_steps or stopping:
                save_checkpoint(run, step, params, opt_state, {"batches_consumed": step, "seed": cfg.seed,
                                                              "total_steps": total_steps})
            if stopping:
                break
    return TrainResult(run, step, history, time.perf_counter() - t0)


def _read_metrics(path: Path, upto: int) -> list[dict[str, Any]]:
    if not path.exists() or upto == 0:
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        return [r for r in csv.DictReader(fh) if int(r["step"]) <= upto]
