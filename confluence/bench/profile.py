"""Where a training step's time goes, operation by operation: a `jax.profiler` trace of the fused step on
`bench train`'s synthetic batches, its XLA operations summed by kind and by output shape.

The kind is the operation's name without its number (`ynn_fusion`: a matrix product with what XLA:CPU fused into
it; `divide_convert_fusion`, ...), the shape is its result's in the compiled module, so a table row reads "the
attention score tensors [16, 4, 128, 128]: 4.7 ms per step in 12 operations". The trace itself stays in the output
folder for TensorBoard's profile plugin or Perfetto. Operation times add up over the device's threads (XLA:CPU runs
independent operations side by side), so their sum can exceed the step's wall time.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import jax

from confluence.bench.train import StepBench
from confluence.training.config import RunConfig

# "%name = shape opcode(" in XLA's text form of a compiled module (the result shape of every instruction)
_INSTR = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) [\w\-]+\(")


@dataclass(frozen=True)
class OpGroup:
    """Operations of one kind or one output shape: ms per step summed, and how many ran per step."""

    name: str
    ms_per_step: float
    ops_per_step: float


@dataclass(frozen=True)
class StepProfile:
    """A traced window of train steps: wall time, operation time, the operations grouped two ways, the trace."""

    steps: int
    wall_ms_per_step: float  # the traced steps' wall time per step
    op_ms_per_step: float  # the matched operations' time per step, summed over threads
    by_kind: list[OpGroup]
    by_shape: list[OpGroup]
    trace_dir: str

    def table(self, top: int = 15) -> str:
        """The two summaries as plain text, largest first."""
        lines = [f"{self.steps} steps: {self.wall_ms_per_step:.1f} ms per step (wall), operations "
                 f"{self.op_ms_per_step:.1f} ms per step (summed over threads); trace: {self.trace_dir}"]
        for title, groups in (("by kind", self.by_kind), ("by output shape", self.by_shape)):
            lines.append(f"{title}:")
            lines += [f"  {g.ms_per_step:7.2f} ms {g.ops_per_step:6.1f}x  {g.name}" for g in groups[:top]]
        return "\n".join(lines)


def instruction_shapes(hlo_text: str) -> dict[str, str]:
    """Instruction name -> result shape, for every instruction of a compiled module's text."""
    shapes: dict[str, str] = {}
    for line in hlo_text.splitlines():
        m = _INSTR.match(line)
        if m:
            shapes.setdefault(m.group(1), m.group(2))
    return shapes


def summarize_trace(events: list[dict], shapes: dict[str, str], steps: int) -> tuple[float, list[OpGroup],
                                                                                       list[OpGroup]]:
    """(ms per step, by kind, by shape) of the trace's complete events that name an instruction of the module
    (directly or in their `hlo_op` argument, as GPU kernel events do)."""
    kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    shape: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    total = 0.0
    for e in events:
        if e.get("ph") != "X":
            continue
        name = e.get("name", "")
        if name not in shapes:
            name = (e.get("args") or {}).get("hlo_op", "")
            if name not in shapes:
                continue
        ms = e.get("dur", 0) / 1e3 / steps
        total += ms
        for table, key in ((kind, re.sub(r"\.\d+$", "", name)), (shape, shapes[name])):
            table[key][0] += ms
            table[key][1] += 1 / steps

    def groups(table):
        return sorted((OpGroup(k, v[0], v[1]) for k, v in table.items()), key=lambda g: -g.ms_per_step)

    return total, groups(kind), groups(shape)


def profile_step(cfg: RunConfig, out_dir: str | Path, steps: int = 10, warmup: int = 3) -> StepProfile:
    """Trace `steps` fused train steps of `cfg` (after `warmup` untraced ones) into `out_dir` and summarize them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    b = StepBench(cfg)
    hlo = b.trainer._step.lower(*b.state, b.inputs[0], *b.tabs).compile().as_text()
    (out / "step.hlo.txt").write_text(hlo)
    for _ in range(warmup):
        b.step()
    jax.block_until_ready(b.state)
    jax.profiler.start_trace(str(out))
    t0 = time.perf_counter()
    try:
        for _ in range(steps):
            b.step()
        jax.block_until_ready(b.state)
        wall = (time.perf_counter() - t0) * 1e3 / steps
    finally:
        jax.profiler.stop_trace()
    traces = sorted(out.glob("**/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise RuntimeError(f"jax.profiler wrote no trace under {out}")
    events = json.loads(gzip.decompress(traces[-1].read_bytes()))["traceEvents"]
    total, by_kind, by_shape = summarize_trace(events, instruction_shapes(hlo), steps)
    return StepProfile(steps, wall, total, by_kind, by_shape, str(out))
