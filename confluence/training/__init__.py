"""Training of the relational transformer: optimizer, schedule, train step, loop, checkpoints, presets."""

from __future__ import annotations


def train_throughput(preset: str = "base", attention_impl: str = "reference", steps: int = 5) -> dict:
    """End-to-end training throughput (forward + backward + update) of a preset with the given attention
    implementation, on synthetic batches of the preset's shapes: the figures of `confluence bench train`."""
    from confluence.training.bench import bench_train, result_dict
    from confluence.training.presets import load_config

    cfg = load_config(preset, {"model": {"attention_impl": attention_impl}})
    return result_dict(bench_train(cfg, preset, steps=steps))
