"""`confluence bench attention`: forward and forward+backward time of each sublayer type, three implementations.

Implementations timed on the same q / k / v and mask inputs:

* `kernel`: `attend_block_sparse` on a `block_structure` (compiled Triton on a GPU; the Pallas interpreter elsewhere, which measures
  correctness plumbing, not speed);
* `reference`: `reference_attention` (dense mask, FP32 logits);
* `dense`: `jax.nn.dot_product_attention` with the dense `[B, 1, S, S]` mask, implementation "cudnn" on a GPU and
  "xla" elsewhere;
* `dense_xla`: the same with implementation "xla" (a second dense baseline on a GPU, should cuDNN refuse a shape).

Structures come from a `StructureSource` (sampler batches of a real store, `sampler_source`), by default from
`synthetic_structure` (sampler-like random subgraphs). Each timing is the median of `repeats`
runs after one compile-and-warm-up run. What an implementation builds once per batch and kind (the kernel's tile
structure, the dense mask) is built before timing and passed in, as training shares it across layers; the
kernel's structure build is timed on its own (`structure_ms`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from confluence.model.attention import MASK_KINDS, MaskKind, dense_mask, reference_attention
from confluence.model.config import KERNEL_HEADS, KERNEL_WARPS
from confluence.model.kernels.block_sparse import DEFAULT_BLOCK, attend_block_sparse, default_interpret
from confluence.model.kernels.structure import block_structure, tile_stats
from confluence.model.kernels.synthetic import PermutedStructure, batch_structure, synthetic_structure

IMPLEMENTATIONS = ("kernel", "reference", "dense", "dense_xla")


@dataclass
class AttentionBenchConfig:
    """What to measure; `batch_size=None` keeps B * S at `tokens_per_batch`."""

    seq_lens: Sequence[int] = (1024, 2048, 4096)
    batch_size: int | None = None
    tokens_per_batch: int = 32 * 1024
    heads: int = 8
    head_dim: int = 32
    block: int = DEFAULT_BLOCK
    repeats: int = 10
    kinds: Sequence[MaskKind] = MASK_KINDS
    implementations: Sequence[str] = ("kernel", "reference", "dense")
    # the kernel's launches to time, (heads per program, warps per program): the model's default launch is timed
    # as "kernel", any other as "kernel[h=H,w=W]" (the same numbers, another grid: docs/design/attention_kernel.md)
    kernel_launches: Sequence[tuple[int, int]] = ((KERNEL_HEADS, KERNEL_WARPS),)
    seed: int = 0


@dataclass
class AttentionBenchResult:
    """One (sequence length, kind) row: timings in milliseconds, speedups and tile statistics."""

    seq_len: int
    batch_size: int
    kind: str
    source: str
    fwd_ms: dict[str, float] = field(default_factory=dict)
    fwd_bwd_ms: dict[str, float] = field(default_factory=dict)
    structure_ms: float = 0.0
    tiles: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    jax.block_until_ready(fn())  # compile and warm up
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - t0) * 1e3)
    return float(statistics.median(times))


def launch_name(heads: int, warps: int) -> str:
    """The report's name of a kernel launch: "kernel" for the model's default, else "kernel[h=H,w=W]"."""
    return "kernel" if (heads, warps) == (KERNEL_HEADS, KERNEL_WARPS) else f"kernel[h={heads},w={warps}]"


def _attention_fn(
    name: str, kind: MaskKind, struct: tuple[jax.Array, ...], block: int,
    launch: tuple[int, int] = (KERNEL_HEADS, KERNEL_WARPS)
) -> tuple[Any, Callable[..., jax.Array]]:
    """(what the implementation builds once per batch and kind, the sublayer's attention given it). The prepared
    part is computed before timing and passed to the jitted attention as an argument, as training shares it across
    layers: closed over as a constant, XLA folded its sorts at compile time ("constant folding of a sort", seen on
    a GPU)."""
    if name == "kernel":
        st = jax.jit(lambda *a: block_structure(kind, *a, block))(*struct)
        heads, warps = launch
        # the model's launch: the sampler's (and the synthetic structures') rows are contiguous
        return st, lambda q, k, v, st: attend_block_sparse(q, k, v, kind, st, heads=heads, warps=warps,
                                                           contiguous_rows=True)
    if name == "reference":  # builds its mask inside each sublayer, as the model's reference path does
        return struct, lambda q, k, v, st: reference_attention(q, k, v, kind, *st)
    if name in ("dense", "dense_xla"):
        impl = "cudnn" if name == "dense" and jax.default_backend() == "gpu" else "xla"
        mask = jax.jit(lambda *a: dense_mask(kind, *a)[:, None])(*struct)
        return mask, lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m, scale=1.0, implementation=impl)
    raise ValueError(f"unknown implementation {name!r}; expected one of {IMPLEMENTATIONS}")


def _inputs(seed: int, b: int, s: int, h: int, d: int):
    kq, kk, kv, kd = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (b, s, h, d), jnp.float32)
    k = jax.random.normal(kk, (b, s, h, d), jnp.float32)
    q = 4.0 * q / jnp.linalg.norm(q, axis=-1, keepdims=True)
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jax.random.normal(kv, (b, s, h, d), jnp.float32)
    do = jax.random.normal(kd, (b, s, h, d), jnp.float32)
    return tuple(x.astype(jnp.bfloat16) for x in (q, k, v, do))


def bench_one(
    struct: PermutedStructure, kind: MaskKind, cfg: AttentionBenchConfig, source: str
) -> AttentionBenchResult:
    """Time every implementation of `cfg` on one structure of one kind."""
    b, s = struct.row_ids.shape
    res = AttentionBenchResult(seq_len=s, batch_size=b, kind=kind, source=source)
    res.tiles = tile_stats(kind, *struct, block=cfg.block)
    args = tuple(jnp.asarray(x) for x in struct)
    q, k, v, do = _inputs(cfg.seed, b, s, cfg.heads, cfg.head_dim)
    build = jax.jit(lambda *a: block_structure(kind, *a, cfg.block))
    res.structure_ms = _median_ms(lambda: build(*args), cfg.repeats)
    runs = []
    for name in cfg.implementations:
        if name == "kernel":
            runs += [(launch_name(*launch), name, launch) for launch in cfg.kernel_launches]
        else:
            runs.append((name, name, (KERNEL_HEADS, KERNEL_WARPS)))
    for label, name, launch in runs:
        try:
            prep, fn = _attention_fn(name, kind, args, cfg.block, launch)
            fwd = jax.jit(fn)
            grad = jax.jit(
                jax.grad(lambda q, k, v, p, fn=fn: jnp.vdot(fn(q, k, v, p).astype(jnp.float32), do), (0, 1, 2))
            )
            res.fwd_ms[label] = _median_ms(lambda fwd=fwd, p=prep: fwd(q, k, v, p), cfg.repeats)
            res.fwd_bwd_ms[label] = _median_ms(lambda grad=grad, p=prep: grad(q, k, v, p), cfg.repeats)
        except Exception as exc:  # an implementation the backend lacks (e.g. cuDNN at this shape): report it
            res.errors[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return res


StructureSource = Callable[[int, int], dict[str, PermutedStructure]]


def synthetic_source(seed: int) -> StructureSource:
    """(seq_len, batch_size) -> sampler-like random structures of every kind."""
    return lambda s, b: {kind: synthetic_structure(seed, kind, b, s) for kind in MASK_KINDS}


def sampler_source(
    store_path: str, task: str | None = None, seed: int = 0, perm_tile: int | None = None
) -> tuple[StructureSource, str]:
    """(seq_len, batch_size) -> the structures of one real sampler batch of `task` (default: the store's first);
    `perm_tile` is the sampler's (None: its default; 0: seed 000's row orders)."""
    from confluence.sampler.config import SamplerConfig
    from confluence.sampler.sampler import Sampler
    from confluence.store import Store

    store = Store.open(store_path)
    name = task or store.tasks[0].name
    store.task(name)  # raises, naming the task, when it does not exist
    # checked here (a bad perm_tile raises a ConfigError naming it), before any batch is asked for
    cfg = SamplerConfig(tasks=(name,), **({} if perm_tile is None else {"perm_tile": perm_tile}))

    def source(s: int, b: int) -> dict[str, PermutedStructure]:
        with Sampler([store], replace(cfg, batch_size=b, seq_len=s), seed=seed) as sampler:
            n = sampler.entry(name).task.num_seeds
            ids = np.random.default_rng(seed).choice(n, size=b, replace=n < b)
            batch = sampler.batch_for_seeds(name, ids)
        return {kind: batch_structure(batch, kind) for kind in MASK_KINDS}

    return source, f"sampler:{store.name}/{name}"


def run_attention_bench(
    cfg: AttentionBenchConfig,
    source: StructureSource | None = None,
    source_name: str = "synthetic",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the whole benchmark; returns a JSON-ready dict (environment, config, one row per (S, kind))."""
    source = source or synthetic_source(cfg.seed)
    rows = []
    for s in cfg.seq_lens:
        b = cfg.batch_size or max(1, cfg.tokens_per_batch // s)
        structs = source(s, b)
        for kind in cfg.kinds:
            res = bench_one(structs[kind], kind, cfg, source_name)
            rows.append(asdict(res))
            log(format_row(res))
    device = jax.devices()[0]
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": jax.default_backend(),
        "device": getattr(device, "device_kind", str(device)),
        "jax_version": jax.__version__,
        "kernel_mode": "interpret" if default_interpret() else "compiled",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
        "rows": rows,
    }


def format_row(res: AttentionBenchResult) -> str:
    """One human-readable line per (S, kind)."""
    t = res.tiles
    parts = [
        f"S={res.seq_len:5d} B={res.batch_size:3d} {res.kind:8s}",
        f"tiles {t['nonempty']}/{t['tiles']} ({100 * t['tile_density']:.1f}%, fill {100 * t['fill']:.0f}%)",
        f"structure {res.structure_ms:.2f} ms",
    ]
    for name, ms in res.fwd_bwd_ms.items():
        parts.append(f"{name} fwd {res.fwd_ms[name]:.2f} / fwd+bwd {ms:.2f} ms")
    kern = res.fwd_bwd_ms.get("kernel")
    for other in ("dense", "reference"):
        if kern and other in res.fwd_bwd_ms:
            parts.append(f"x{res.fwd_bwd_ms[other] / kern:.2f} vs {other}")
    parts += [f"{name} failed: {err}" for name, err in res.errors.items()]
    return " | ".join(parts)


def speedups(report: dict[str, Any], baseline: str = "dense") -> dict[tuple[int, str], float]:
    """fwd+bwd time of `baseline` over the kernel's, per (S, kind) row where both ran."""
    out = {}
    for row in report["rows"]:
        t = row["fwd_bwd_ms"]
        if "kernel" in t and baseline in t and t["kernel"] > 0:
            out[(row["seq_len"], row["kind"])] = t[baseline] / t["kernel"]
    return out


def as_numpy_report(report: dict[str, Any]) -> dict[str, Any]:
    """The report with NumPy scalars turned into Python numbers (json.dump-safe)."""

    def conv(x):
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [conv(v) for v in x]
        if isinstance(x, np.generic):
            return x.item()
        return x

    return conv(report)
