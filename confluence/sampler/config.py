"""Sampler settings (`SamplerConfig`, section `sampler` of a run's tree) and split settings (`SplitConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from confluence.errors import ConfigError
from confluence.store.format import COUNT_WINDOWS_DAYS
from confluence.toolkit.config import one_of

CHILD_COUNTS = ("none", "anchor", "all")  # which rows show child-count cells (docs/design/sampler.md)
CHILD_MEANS = ("none", "anchor_and_parents")  # which rows show children's-mean cells (docs/design/sampler.md)
TASK_CHOICES = ("uniform", "database_first", "seeds")  # how the training stream picks each batch's task


# the settings that map task keys ("task" or "db/task") to values: tables of values, not sections of settings
PER_TASK_SETTINGS = ("task_weights", "task_recent", "task_labels", "task_label_match")


@dataclass(frozen=True)
class SplitConfig:
    """How seeds are split into train / val / test (spec/tasks.md).

    mode "hash": each (task, anchor row) goes to a split by a stable hash with `seed` and `fractions`.
    mode "temporal": observation time <= `t_val` is train, <= `t_test` is val, later is test (epoch µs).
    """

    mode: Literal["hash", "temporal"] = "hash"
    seed: int = 0
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
    t_val: int | None = None
    t_test: int | None = None

    def __post_init__(self) -> None:
        one_of("mode", self.mode, ("hash", "temporal"))
        if self.mode == "hash":
            if len(self.fractions) != 3 or min(self.fractions) < 0 or abs(sum(self.fractions) - 1.0) > 1e-6:
                raise ConfigError("fractions", f"{self.fractions} must be three non-negative numbers summing to 1")
        elif self.t_val is None or self.t_test is None or not self.t_val < self.t_test:
            raise ConfigError("t_val", "a temporal split needs t_val < t_test (epoch microseconds), got "
                                       f"t_val={self.t_val}, t_test={self.t_test}")


@dataclass(frozen=True)
class SamplerConfig:
    """Everything that shapes the batches and the batch stream. The same config, stores and seed give the same
    batches in the same order, whatever `threads` and `prefetch`."""

    # The settings beyond seed 000's walk that the defaults turn on (the `small` recipe's), at the seed's values:
    # a saved config that does not name one was built without it; configs/seed.toml sets them so
    SEED: ClassVar[dict[str, Any]] = {"recent": 0, "width_per_fk": False, "child_counts": "none",
                                       "child_count_windows": (), "child_means": "none"}
    # removed after measurement rejected it (docs/design/decisions.md, "Removed settings"): its "off" value still loads
    RETIRED: ClassVar[dict[str, Any]] = {"window_count_stats": "at_child"}

    batch_size: int = 32  # sequences per batch, over all processes
    seq_len: int = 1024  # S, cells per sequence (context and target)
    max_rows: int = 256  # cap on R, the rows of one sequence
    width: int = 16  # at most this many children of a row are followed (uniform subsample)
    recent: int = 16  # of those `width`, the most recent this many are always kept; the rest stay uniform
    task_recent: dict[str, int] | None = None  # "task" or "db/task" -> `recent` for that task's sequences
    width_per_fk: bool = True  # `width` (and `recent`) per row and child foreign-key column, not per row
    # labelled task rows per context (in-context learning, `confluence.sampler.labels`): 0 keeps contexts without
    # labels; k reserves room for k rows of 1-2 cells each at the end of the sequence
    labels: int = 0
    # "task" or "db/task" -> labelled rows for that task's contexts instead of `labels` (0..labels): 0 gives a task
    # whose rows say more than its labels the whole context (measured: docs/design/decisions.md, "The `demo` recipe shows
    # labelled context")
    task_labels: dict[str, int] | None = None
    # of those labelled rows, up to this many are rows that share a value with the anchor row (a flight of the same
    # flight number, a plane of the same seat count): the most telling labels of a static table, whose others are
    # random rows (`confluence.sampler.labels`, "matches"); 0 = none, the contexts as before
    label_match: int = 0
    # "task" or "db/task" -> `label_match` for that task's contexts (0..labels): 0 for a task whose time neighbours
    # (siblings) say more than rows of the same value (measured: docs/design/decisions.md, "Label matches")
    task_label_match: dict[str, int] | None = None
    # the share of *training* contexts shown no labels (drawn per sequence and epoch): a model that always sees its
    # task's labels may learn to copy them instead of reading the rows (docs/design/decisions.md, "`labels_off` stays 0");
    # 0 = always shown
    labels_off: float = 0.0
    # the share of *training* contexts whose task answers are re-coded consistently in every cell of the context (a
    # permutation of the classes, swapped booleans, an affine map of z-scored numbers: `confluence.sampler.relabel`),
    # so that only the context's labelled rows say what the answers are; 0 = never
    relabel: float = 0.0
    child_counts: Literal["none", "anchor", "all"] = "anchor"  # "anchor" / "all": the anchor / every row also shows,
    # per foreign key pointing at its table, how many rows referenced it by the observation time
    # and, with child counts on, how many did within each of these windows (days, from the store's
    # `COUNT_WINDOWS_DAYS`) before the observation time, for the foreign keys of temporal tables; () = none
    child_count_windows: tuple[int, ...] = COUNT_WINDOWS_DAYS
    # with child counts on, also the days since the latest referencing row, per foreign key of a temporal table
    child_latest: bool = False
    # "anchor_and_parents": the anchor row and the rows it references also show, per foreign key of a temporal
    # table pointing at theirs and per numerical or boolean column of that table, the column's mean over the
    # latest `child_mean_rows` referencing rows before the observation time (a team's form, a courier's usual
    # handling time), at most `child_mean_cells` such cells a row; "none": no such cells
    child_means: Literal["none", "anchor_and_parents"] = "anchor_and_parents"
    child_mean_rows: int = 32  # the latest this many referencing rows before the observation time are averaged
    child_mean_cells: int = 16  # at most this many children's-mean cells a row (in column order)
    # fill the batch's `child_rank` (each row reached as a child: its recency rank among its parent's children
    # through that foreign key at the observation time), which `model.child_rank` reads; a run whose model reads
    # it turns this on itself (RunConfig). Off, the field holds CHILD_RANK_UNKNOWN and the sampler saves the rank's
    # binary searches and its per-foreign-key copy of the child lists (docs/design/sampler.md)
    child_rank: bool = False
    # > 0: the outbound / inbound permutations take, of a few row orders, the one whose mask visits the fewest
    # tiles of this size (the block-sparse kernel's tile: its work follows the visited tiles); 0 = seed 000's
    # Cuthill-McKee orders alone. Only the kernel reads the permutations (docs/design/sampler.md, "Permutations")
    perm_tile: int = 64
    row_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)  # R is padded up to one of these
    text_buckets: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384)  # U is padded up to one of these
    split: SplitConfig = field(default_factory=SplitConfig)
    tasks: tuple[str, ...] | None = None  # "task" or "db/task"; None = every task of every store
    # the task of each training batch: "uniform" over the tasks, "database_first" (a database uniformly, then one
    # of its tasks) or "seeds" (in proportion to the task's train seeds); `task_weights` multiply each task's share
    task_choice: Literal["uniform", "database_first", "seeds"] = "uniform"
    task_weights: dict[str, float] | None = None  # "task" or "db/task" -> weight (default 1)
    threads: int = 1  # worker threads building batches (the batches do not depend on it)
    prefetch: int = 2  # batches a stream builds ahead in a background thread (0: built when asked for)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError("batch_size", f"must be >= 1, got {self.batch_size}")
        if not 2 <= self.seq_len <= 65535:
            raise ConfigError("seq_len", f"must be in 2..65535 (uint16 permutations), got {self.seq_len}")
        if not 1 <= self.max_rows <= 65535:
            raise ConfigError("max_rows", f"must be in 1..65535 (uint16 row ids), got {self.max_rows}")
        if not isinstance(self.labels, int) or not 0 <= 2 * self.labels < min(self.seq_len, 2 * self.max_rows):
            raise ConfigError("labels", f"must be an integer with 2 x labels below seq_len ({self.seq_len}) and "
                                        f"labels below max_rows ({self.max_rows}), got {self.labels!r}")
        counts = [("label_match", self.label_match)]
        for name in ("task_labels", "task_label_match"):
            counts += [(f"{name}[{key!r}]", k) for key, k in (getattr(self, name) or {}).items()]
        for name, k in counts:  # labelled rows of one task, or matches among them
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= self.labels:
                raise ConfigError(name, f"must be an integer in 0..labels ({self.labels}), got {k!r}")
        if not isinstance(self.labels_off, int | float) or not 0.0 <= float(self.labels_off) < 1.0:
            raise ConfigError("labels_off", f"must be a share in [0, 1), got {self.labels_off!r}")
        if not isinstance(self.relabel, int | float) or not 0.0 <= float(self.relabel) <= 1.0:
            raise ConfigError("relabel", f"must be a share in [0, 1], got {self.relabel!r}")
        if self.width < 0:
            raise ConfigError("width", f"must be >= 0, got {self.width}")
        if not 0 <= self.recent <= self.width:
            raise ConfigError("recent", f"must be in 0..width ({self.width}), got {self.recent}"
                                        + (" (the default keeps the 16 most recent children: with a smaller width, "
                                           "set recent too)" if self.recent == 16 else ""))
        for key, k in (self.task_recent or {}).items():
            if not isinstance(k, int) or not 0 <= k <= self.width:
                raise ConfigError(f"task_recent[{key!r}]", f"must be an integer in 0..width ({self.width}), got {k!r}")
        if not isinstance(self.width_per_fk, bool):
            raise ConfigError("width_per_fk", f"must be true or false, got {self.width_per_fk!r}")
        if not isinstance(self.child_rank, bool):
            raise ConfigError("child_rank", f"must be true or false, got {self.child_rank!r}")
        one_of("child_counts", self.child_counts, CHILD_COUNTS)
        w = self.child_count_windows
        if (not isinstance(w, tuple | list) or list(w) != sorted(set(w))
                or any(isinstance(x, bool) or x not in COUNT_WINDOWS_DAYS for x in w)):
            raise ConfigError("child_count_windows", f"must be increasing days out of {list(COUNT_WINDOWS_DAYS)}, "
                                                     f"got {w!r}")
        if w and self.child_counts == "none":
            raise ConfigError("child_count_windows", "needs child_counts = \"anchor\" or \"all\" (the windows are "
                                                     "more count cells)")
        if not isinstance(self.child_latest, bool):
            raise ConfigError("child_latest", f"must be true or false, got {self.child_latest!r}")
        if self.child_latest and self.child_counts == "none":
            raise ConfigError("child_latest", "needs child_counts = \"anchor\" or \"all\" (the days since the "
                                              "latest child sit beside the count cells)")
        one_of("child_means", self.child_means, CHILD_MEANS)
        for name in ("child_mean_rows", "child_mean_cells"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
                raise ConfigError(name, f"must be an integer in 1..4096, got {v!r}")
        if isinstance(self.perm_tile, bool) or not isinstance(self.perm_tile, int) or (
                self.perm_tile != 0 and (self.perm_tile < 16 or self.perm_tile & (self.perm_tile - 1))):
            raise ConfigError("perm_tile", f"must be 0 or a power of two >= 16, got {self.perm_tile!r}")
        for name in ("row_buckets", "text_buckets"):
            b = getattr(self, name)
            if not b or sorted(b) != list(b) or min(b) < 1:
                raise ConfigError(name, f"must be increasing positive sizes, got {b}")
        one_of("task_choice", self.task_choice, TASK_CHOICES)
        for key, w in (self.task_weights or {}).items():
            if not isinstance(w, int | float) or isinstance(w, bool) or not w >= 0:
                raise ConfigError(f"task_weights[{key!r}]", f"must be a number >= 0, got {w!r}")
        if self.threads < 1:
            raise ConfigError("threads", f"must be >= 1, got {self.threads}")
        if self.prefetch < 0:
            raise ConfigError("prefetch", f"must be >= 0, got {self.prefetch}")


def _per_task(table: dict[str, int] | None, db_name: str, task_name: str, default: int) -> int:
    """A per-task setting's value for one task: its "db/task" key, then its "task" key, else the default."""
    given = table or {}
    return int(given.get(f"{db_name}/{task_name}", given.get(task_name, default)))


def recent_for(cfg: SamplerConfig, db_name: str, task_name: str) -> int:
    """The `recent` setting for one task's sequences: `task_recent` by "db/task", then by "task", else `recent`."""
    return _per_task(cfg.task_recent, db_name, task_name, cfg.recent)


def labels_for(cfg: SamplerConfig, db_name: str, task_name: str) -> int:
    """The labelled rows of one task's contexts: `task_labels` by "db/task", then by "task", else `labels`."""
    return _per_task(cfg.task_labels, db_name, task_name, cfg.labels)


def label_match_for(cfg: SamplerConfig, db_name: str, task_name: str) -> int:
    """The matched labels of one task's contexts (at most its labels): `task_label_match` by "db/task", then by
    "task", else `label_match`."""
    m = _per_task(cfg.task_label_match, db_name, task_name, cfg.label_match)
    return min(m, labels_for(cfg, db_name, task_name))


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
