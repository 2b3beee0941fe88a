"""Sampler settings (`SamplerConfig`) and split settings (`SplitConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluence.errors import ConfluenceError


@dataclass(frozen=True)
class SplitConfig:
    """How seeds are split into train / val / test (spec/tasks.md).

    mode "hash": each (task, anchor row) goes to a split by a stable hash with `seed` and `fractions`.
    mode "temporal": observation time <= `t_val` is train, <= `t_test` is val, later is test (epoch µs).
    """

    mode: str = "hash"
    seed: int = 0
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    t_val: int | None = None
    t_test: int | None = None

    def check(self) -> None:
        if self.mode not in ("hash", "temporal"):
            raise ConfluenceError(f"split mode {self.mode!r} is unknown (expected 'hash' or 'temporal')")
        if self.mode == "hash":
            if len(self.fractions) != 3 or min(self.fractions) < 0 or abs(sum(self.fractions) - 1.0) > 1e-6:
                raise ConfluenceError(f"split fractions {self.fractions} must be three non-negative numbers summing to 1")
        else:
            if self.t_val is None or self.t_test is None or not self.t_val < self.t_test:
                raise ConfluenceError(
                    f"temporal split needs t_val < t_test (epoch microseconds), got t_val={self.t_val}, t_test={self.t_test}"
                )


CHILD_COUNTS = ("none", "anchor", "all")  # which rows show child-count cells (docs/sampler.md)


@dataclass(frozen=True)
class SamplerConfig:
    """Everything that shapes the batches. The same config (and stores) gives the same batches, whatever `threads`."""

    batch_size: int = 32
    seq_len: int = 1024
    width: int = 16  # at most this many children of a row are followed (uniform subsample)
    recent: int = 0  # of those `width`, the most recent this many are always kept; the rest stay uniform
    task_recent: dict[str, int] | None = None  # "task" or "db/task" -> `recent` for that task's sequences
    width_per_fk: bool = False  # `width` (and `recent`) per row and child foreign-key column, not per row
    child_counts: str = "none"  # "anchor" / "all": the anchor / every row also shows, per foreign key pointing at
    # its table, how many rows referenced it by the observation time ("none": the spec's cells)
    max_rows: int = 256  # cap on R, the rows of one sequence
    row_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)  # R is padded up to one of these
    text_buckets: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384)  # U is padded up to one of these
    threads: int = 1
    seed: int = 0  # sampling seed (walk randomness, task order, seed shuffles)
    split: SplitConfig = field(default_factory=SplitConfig)
    tasks: tuple[str, ...] | None = None  # "task" or "db/task"; None = every task of every store
    task_weights: dict[str, float] | None = None  # "task" or "db/task" -> weight; default: number of seeds
    rank: int = 0
    world_size: int = 1
    batches_per_epoch: int | None = None  # train; default: seeds of the shard // batch_size

    def check(self) -> None:
        """Raise ConfluenceError naming the first bad setting."""
        if self.batch_size < 1:
            raise ConfluenceError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 2 <= self.seq_len <= 65535:
            raise ConfluenceError(f"seq_len must be in 2..65535 (uint16 permutations), got {self.seq_len}")
        if self.width < 0:
            raise ConfluenceError(f"width must be >= 0, got {self.width}")
        if not 0 <= self.recent <= self.width:
            raise ConfluenceError(f"recent must be in 0..width ({self.width}), got {self.recent}")
        for key, k in (self.task_recent or {}).items():
            if not isinstance(k, int) or not 0 <= k <= self.width:
                raise ConfluenceError(f"task_recent[{key!r}] must be an integer in 0..width ({self.width}), got {k!r}")
        if not isinstance(self.width_per_fk, bool):
            raise ConfluenceError(f"width_per_fk must be true or false, got {self.width_per_fk!r}")
        if self.child_counts not in CHILD_COUNTS:
            raise ConfluenceError(f"child_counts must be one of {', '.join(CHILD_COUNTS)}, got {self.child_counts!r}")
        if not 1 <= self.max_rows <= 65535:
            raise ConfluenceError(f"max_rows must be in 1..65535 (uint16 row ids), got {self.max_rows}")
        if not self.row_buckets or sorted(self.row_buckets) != list(self.row_buckets) or min(self.row_buckets) < 1:
            raise ConfluenceError(f"row_buckets must be increasing positive sizes, got {self.row_buckets}")
        if not self.text_buckets or sorted(self.text_buckets) != list(self.text_buckets) or min(self.text_buckets) < 1:
            raise ConfluenceError(f"text_buckets must be increasing positive sizes, got {self.text_buckets}")
        if self.threads < 1:
            raise ConfluenceError(f"threads must be >= 1, got {self.threads}")
        if not 0 <= self.rank < self.world_size:
            raise ConfluenceError(f"rank must be in 0..world_size-1, got rank={self.rank}, world_size={self.world_size}")
        self.split.check()


def recent_for(cfg: SamplerConfig, db_name: str, task_name: str) -> int:
    """The `recent` setting for one task's sequences: `task_recent` by "db/task", then by "task", else `recent`."""
    given = cfg.task_recent or {}
    return int(given.get(f"{db_name}/{task_name}", given.get(task_name, cfg.recent)))


def bucket_size(n: int, buckets: tuple[int, ...], cap: int | None = None) -> int:
    """Smallest bucket >= n (at least 1); beyond the largest, the next multiple of it; never above `cap`."""
    n = max(int(n), 1)
    for b in buckets:
        if b >= n:
            size = b
            break
    else:
        top = buckets[-1]
        size = -(-n // top) * top
    if cap is not None:
        size = min(size, max(cap, n))
    return size
