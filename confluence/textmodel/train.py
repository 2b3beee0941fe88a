"""LeJEPA text training on the toolkit: Muon + AdamW (`confluence.toolkit.optim`), gradient accumulation, data
parallelism over a device mesh, atomic checkpoints, scalar logs, background batch preparation.

Data parallelism: a 1-D `jax.sharding.Mesh` with axis "data"; the per-device loss and gradients run under
`jax.shard_map` and are averaged with `lax.pmean` over "data" (SIGReg sums its characteristic function over the
axis, so it sees the global batch). Parameters and optimizer state are replicated.
"""

from __future__ import annotations

import json
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

from confluence import outputs
from confluence.errors import ConfluenceError
from confluence.textmodel.config import TextRunConfig
from confluence.textmodel.data import (
    TOKENIZER_FILE,
    MMapTokenDataset,
    iter_text_batches,
    num_batches,
    strip_eos,
)
from confluence.textmodel.losses import sigreg_key
from confluence.textmodel.model import TextTransformer
from confluence.textmodel.objective import BATCH_KEYS, compute_losses, host_batch, metric_names
from confluence.textmodel.views import make_views, view_seed
from confluence.toolkit.checkpoint import latest_checkpoint, load_state, save_checkpoint
from confluence.toolkit.interrupt import StepBoundaryInterrupt
from confluence.toolkit.layers import cast_floating
from confluence.toolkit.logs import ScalarLog
from confluence.toolkit.memory import check_fits
from confluence.toolkit.mesh import make_mesh
from confluence.toolkit.optim import ADAMW_DECAY, ADAMW_NO_DECAY, MUON, label_by_path, make_optimizer
from confluence.toolkit.prefetch import Prefetcher
from confluence.toolkit.provenance import code_provenance

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
FLOAT16_LOSS_SCALE = 1024.0
NOT_MUON = ("embed", "mask_pos_emb", "gamma", "pope_delta")  # 2-D leaves that AdamW updates
NOT_DECAYED = ("gamma", "pope_delta")


def text_param_labels(params: Any) -> Any:
    """Muon for every 2-D matrix but the token / mask-position embeddings and the PoPE phase bias; AdamW with
    weight decay for the embeddings, without for norm scales, the phase bias and any other non-2-D array."""

    def rule(names: list[str], leaf: Any) -> str:
        if leaf.ndim == 2 and not any(n in NOT_MUON for n in names):
            return MUON
        return ADAMW_DECAY if leaf.ndim == 2 and not any(n in NOT_DECAYED for n in names) else ADAMW_NO_DECAY

    return label_by_path(params, rule)


# ---------------------------------------------------------------------------------------------- the step


@dataclass
class SpecialIds:
    pad_id: int
    mask_id: int
    bos_id: int
    eos_id: int


def build_train_step(cfg: TextRunConfig, static: Any, opt: optax.GradientTransformation, ids: SpecialIds,
                     mesh: Mesh) -> Callable[..., Any]:
    """jit-compiled (params, opt_state, batch, step) -> (params, opt_state, metrics).

    `batch` arrays are [grad_accum, global_batch, ...], sharded over "data" on axis 1.
    """
    dtype = DTYPES[cfg.compute_dtype]
    scale = FLOAT16_LOSS_SCALE if cfg.compute_dtype == "float16" else 1.0
    names = metric_names(cfg)

    def micro_loss(params: Any, mb: dict[str, jax.Array], step: jax.Array, micro: jax.Array) -> tuple[jax.Array, Any]:
        model = eqx.combine(cast_floating(params, dtype), static)
        skey = sigreg_key(cfg.seed, step * cfg.grad_accum + micro)
        dkey = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 1), step), micro)
        dkey = jax.random.fold_in(dkey, jax.lax.axis_index("data"))
        total, m = compute_losses(model, mb, cfg, pad_id=ids.pad_id, mask_id=ids.mask_id, bos_id=ids.bos_id,
                                  eos_id=ids.eos_id, sigreg_key=skey,
                                  key=dkey if cfg.model.drop_path_rate > 0 else None, axis_name="data")
        return total * scale, {k: m[k] for k in names}

    def local(params: Any, batch: dict[str, jax.Array], step: jax.Array) -> tuple[Any, Any]:
        grad_fn = jax.grad(micro_loss, has_aux=True)

        def accumulate(carry: tuple[Any, Any], xs: tuple[jax.Array, dict[str, jax.Array]]) -> tuple[Any, None]:
            g_acc, m_acc = carry
            micro, mb = xs
            g, m = grad_fn(params, mb, step, micro)
            return (jax.tree.map(lambda a, b: a + b.astype(jnp.float32), g_acc, g),
                    {k: m_acc[k] + m[k] for k in names}), None

        # a loop, not unrolled: XLA then holds one micro-batch's activations at a time (unrolled, it kept them all:
        # text-base at batch_size 64 x grad_accum 2 needed the memory of batch_size 128)
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        init = (zeros, {k: jnp.zeros((), jnp.float32) for k in names})
        (g_acc, m_acc), _ = jax.lax.scan(accumulate, init, (jnp.arange(cfg.grad_accum, dtype=jnp.int32), batch))
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


# ---------------------------------------------------------------------------------------------- runs


def load_run_config(run: str | Path) -> TextRunConfig:
    """The TextRunConfig saved in a run directory (or in one of its checkpoints, which carry it too)."""
    from confluence.toolkit.checkpoint import META_FILE

    path = Path(run)
    try:
        if (path / META_FILE).is_file():
            return TextRunConfig.from_dict(json.loads((path / META_FILE).read_text(encoding="utf-8"))["config"])
        return TextRunConfig.from_dict(json.loads((path / "config.json").read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ConfluenceError(f"{run}: no config.json; not a text-model run directory") from None
    except (json.JSONDecodeError, KeyError) as exc:
        raise ConfluenceError(f"{path}: not a text-model run configuration ({exc})") from None


def load_params(ckpt: Path, cfg: TextRunConfig) -> tuple[Any, Any]:
    """(params, static) of the model in checkpoint directory `ckpt`."""
    template = TextTransformer(cfg.model, jax.random.PRNGKey(0))
    params, static = eqx.partition(template, eqx.is_array)
    params, _ = load_state(ckpt, params)
    return params, static


_COMPILED: dict[tuple, Any] = {}  # one compiled, memory-checked step per configuration and process


@dataclass
class TextTrainResult:
    run_dir: Path
    steps: int
    metrics: list[dict[str, float]]
    seconds: float


TEXT_RUN_FILES = ("checkpoints", "config.json", TOKENIZER_FILE, "data_meta.json", "scalars.csv", "scalars.png",
                  "tensorboard")


def train_text(data_dir: str | Path, run_dir: str | Path, cfg: TextRunConfig, *, resume: bool = True,
               progress: Callable[[dict[str, float]], None] | None = None,
               stop_after: int | None = None) -> TextTrainResult:
    """Train the text model into `run_dir` (see `_train_text`), which must be new, empty, or a text run: a folder
    of other files is refused, and one writer at a time holds it (`confluence.outputs`)."""
    run = Path(run_dir)
    outputs.claim(run, "text-run", legacy=lambda p: {q.name for q in p.iterdir()} <= {*TEXT_RUN_FILES,
                                                                                       outputs.MARKER_FILE})
    with outputs.locked(run, "trained"), outputs.writing(run, "the text-model run",
                                                         "the last checkpoint stands (resume continues it)"):
        outputs.mark(run, "text-run")
        return _train_text(data_dir, run, cfg, resume=resume, progress=progress, stop_after=stop_after)


def _train_text(data_dir: str | Path, run_dir: str | Path, cfg: TextRunConfig, *, resume: bool = True,
                progress: Callable[[dict[str, float]], None] | None = None,
                stop_after: int | None = None) -> TextTrainResult:
    """Train (or resume) a LeJEPA text model on prepared data; one epoch or `cfg.max_train_steps` steps.

    Writes run_dir/config.json, tokenizer.json, data_meta.json, scalars.csv (tags `train/<term>`) and
    checkpoints/step_*/ (state.eqx, meta.json with the configuration, tokenizer.json) every `checkpoint_every`
    steps and at the end. With `resume`, continues from the newest checkpoint exactly where it stopped (same
    batches, same views, same schedule position). `stop_after` ends the call after that global step (with a
    checkpoint), as if the process had been stopped there.
    """
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
    cfg_json = cfg.to_dict()
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
    (run / TOKENIZER_FILE).write_bytes((Path(data_dir) / TOKENIZER_FILE).read_bytes())
    (run / "data_meta.json").write_text(json.dumps(meta.to_json(), indent=2), encoding="utf-8")

    model = TextTransformer(cfg.model, jax.random.PRNGKey(cfg.seed))
    params, static = eqx.partition(model, eqx.is_array)
    optim = cfg.optim.for_run(total_steps)
    opt = make_optimizer(text_param_labels(params), optim)
    opt_state = opt.init(params)
    start = 0
    if ckpt is not None:
        params, opt_state = load_state(ckpt, params, opt_state)
        start = json.loads((ckpt / "meta.json").read_text(encoding="utf-8"))["step"]

    rep = NamedSharding(mesh, P())
    params, opt_state = jax.device_put((params, opt_state), rep)
    ids = SpecialIds(meta.pad_id, meta.mask_id, meta.bos_id, meta.eos_id)
    cache_key = (cfg.replace(max_train_steps=None), total_steps, astuple(ids), tuple(mesh.devices.flat))
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

    log = ScalarLog(run / "scalars.csv", truncate_after_step=start)
    history: list[dict[str, float]] = []
    code = code_provenance()  # read once: the code this process imported at its start
    t0 = time.perf_counter()
    step = start
    try:
        # Ctrl-C stops after the step in flight, with a checkpoint of it (toolkit/interrupt.py)
        with Prefetcher(batches, capacity=2, name="text-batches") as prepared, StepBoundaryInterrupt() as stop:
            for step_idx, batch in prepared:
                step_arg = jnp.asarray(step_idx, jnp.int32)
                if cache_key not in _COMPILED:  # compile once, and say so if the step cannot fit the device
                    step_fn = build_train_step(cfg, static, opt, ids, mesh)
                    compiled = step_fn.lower(params, opt_state, batch, step_arg).compile()
                    check_fits(compiled, f"a text step of batch_size {cfg.batch_size}",
                               f"lower batch_size and raise grad_accum by the same factor (--set batch_size=..., "
                               f"--set grad_accum=...; the effective batch is batch_size x grad_accum = {host_bs})")
                    _COMPILED[cache_key] = compiled
                params, opt_state, m = _COMPILED[cache_key](params, opt_state, batch, step_arg)
                step = step_idx + 1
                if step % cfg.log_every == 0 or step == total_steps or step == start + 1:
                    vals = {k: float(v) for k, v in jax.device_get(m).items()}
                    row = {"step": step, **{k: vals[k] for k in names}, "seconds": round(time.perf_counter() - t0, 3)}
                    log.write(step, {f"train/{k}": vals[k] for k in names} | {"perf/seconds": row["seconds"]})
                    history.append(row)
                    if progress is not None:
                        progress(row)
                stopping = stop_after is not None and step >= stop_after
                if step % cfg.checkpoint_every == 0 or step == total_steps or stopping or stop.requested:
                    save_checkpoint(run, step, params, opt_state,
                                    {"config": cfg_json, "batches_consumed": step, "total_steps": total_steps,
                                     "code": code},
                                    keep=cfg.keep_checkpoints, files={TOKENIZER_FILE: run / TOKENIZER_FILE})
                if stop.requested:
                    raise KeyboardInterrupt
                if stopping:
                    break
    finally:
        log.close()
    return TextTrainResult(run, step, history, time.perf_counter() - t0)
