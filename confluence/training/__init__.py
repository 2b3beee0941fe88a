"""Training of the relational transformer: optimizer, schedule, train step, loop, checkpoints, presets."""

from __future__ import annotations


def train_throughput(preset: str = "base", attention_impl: str = "reference", steps: int = 5,
                     allow_cpu: bool = False) -> dict:
    """End-to-end training throughput (forward + backward + update) of a preset with the given attention
    implementation, on synthetic batches of the preset's shapes: the figures of `confluence bench train`.

    Off a GPU it returns `{"skipped": reason}` unless `allow_cpu` (the `base` preset at B=32, S=1024 with dense
    reference attention needs tens of GB and minutes per step on a CPU)."""
    import jax

    if jax.default_backend() != "gpu" and not allow_cpu:
        return {"skipped": f"no GPU (backend {jax.default_backend()!r}); use `confluence bench train --config small` "
                           "on CPU or pass allow_cpu=True"}
    from confluence.training.bench import bench_train, result_dict
    from confluence.training.presets import load_config

    cfg = load_config(preset, {"model": {"attention_impl": attention_impl}})
    return result_dict(bench_train(cfg, preset, steps=steps))
