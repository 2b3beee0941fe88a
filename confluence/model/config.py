"""Model and loss configuration (seeds 000 / 001 / 002 / 004): sections `model` and `loss` of a run's tree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from confluence.errors import ConfigError
from confluence.stypes import D_TIME
from confluence.toolkit.config import ANY_VALUE, COMPUTE_DTYPES, non_negative, one_of, positive


def ffn_hidden_dim(d_model: int, multiple: int = 256) -> int:
    """SwiGLU hidden size: ceil(8/3 * D) rounded up to a multiple of `multiple` (seed 001: 768 at D=256)."""
    return int(math.ceil((8.0 * d_model / 3.0) / multiple) * multiple)


# The block-sparse kernel's launch on a GPU (docs/design/attention_kernel.md, "Launch"): the default, and what is allowed.
KERNEL_HEADS = 1  # heads per program: one program per (tile, batch, head)
KERNEL_WARPS = 4  # Triton warps per program
KERNEL_WARP_CHOICES = (1, 2, 4, 8, 16)


def kernel_launch_problems(heads: int, warps: int, n_heads: int | None = None) -> list[tuple[str, str]]:
    """("heads" | "warps", what is wrong) for each bad part of a kernel launch; `n_heads`: the heads it must divide."""
    out = []
    if heads < 1 or heads & (heads - 1):
        out.append(("heads", f"heads per program must be a power of two >= 1, got {heads}"))
    elif n_heads is not None and n_heads % heads:
        out.append(("heads", f"heads per program ({heads}) must divide the number of heads ({n_heads})"))
    if warps not in KERNEL_WARP_CHOICES:
        out.append(("warps", f"warps per program must be one of {', '.join(map(str, KERNEL_WARP_CHOICES))}, "
                              f"got {warps}"))
    return out


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of the relational transformer. `d_t` is a property of the processed store."""

    # settings removed after measurement rejected them, with the value that meant "off": a checkpoint or recipe
    # that names one with that value still loads (docs/design/decisions.md, "Removed settings")
    RETIRED: ClassVar[dict[str, Any]] = {"category_codes_by": "row", "numeric_frequencies": 0,
                                          "numeric_frequency_scale": ANY_VALUE}
    # The inputs beyond seeds 000-004 that the defaults turn on (the `small` recipe's, what users get), at the
    # seeds' values: a saved config that does not name one (saved before it existed) was trained without it, and
    # configs/seed.toml sets them so (docs/design/decisions.md, "Defaults are what ships").
    SEED: ClassVar[dict[str, Any]] = {"category_codes": 0.0, "column_codes": 0.0, "row_age": False,
                                       "numeric_by_column": False, "copy_head": False, "time_reference": False,
                                       "time_reference_gate": "learned", "arrival": False,
                                       "time_wait": False, "link_values": False}

    d_model: int = 256  # D, the width of every cell's hidden state
    n_layers: int = 12  # blocks (each: outbound, inbound and column attention, then a SwiGLU FFN)
    n_heads: int = 8  # attention heads (d_model / n_heads per head)
    d_t: int = 256  # width of the text embeddings (the store's; set from it)
    d_time: int = D_TIME  # a timestamp's components: 7 (sin, cos) pairs and the epoch
    ffn_multiple: int = 256  # the SwiGLU hidden size, 8/3 D, is rounded up to a multiple of this
    norm_eps: float = 1e-6  # RMSNorm's epsilon
    compute_dtype: Literal["bfloat16", "float32", "float16"] = "bfloat16"  # activations / matmuls; params FP32
    attention_impl: str = "reference"  # "reference" | "block_sparse" | "auto" (confluence.model.attention)
    # the block-sparse kernel's launch on a GPU (tuning only: the same results, tested bit for bit in the
    # interpreter): heads computed by one program (a power of two dividing n_heads; its heads share the tile
    # list, the scalar loads and the tile mask) and Triton warps per program (docs/design/attention_kernel.md)
    kernel_heads: int = KERNEL_HEADS
    kernel_warps: int = KERNEL_WARPS  # (see kernel_heads)
    remat: bool = False  # recompute each block's activations in the backward pass (less memory, ~1/3 more FLOPs)
    # True: the blocks run as one `lax.scan` (XLA compiles one block: `base` compiles 24 % faster on the CPU, but
    # `small` steps 30 % slower without fusion across blocks); False: a Python loop. Same model and checkpoints
    # either way (docs/design/decisions.md, "Training speed")
    scan_layers: bool = False
    # > 0: add this multiple of a fixed per-category identity code to each category's text embedding (model.inputs.
    # identity_codes); 0 is seed 002's text embedding alone (docs/design/decisions.md says why 1.0 ships).
    category_codes: float = 1.0
    # > 0: add this multiple of a fixed per-column code (keyed by the column's embedded text: model.inputs.
    # column_keys) to each column's name embedding, so columns whose names embed alike stay apart; 0 is seed 002
    column_codes: float = 1.0
    # True: every cell also carries its row's age at the observation time (the batch's `row_age`, days) through
    # a piecewise-linear encoding (model.encoding.age_features), so "within the last 30 days" is one threshold
    # away; False is seed 002 (absolute timestamps only)
    row_age: bool = True
    # True: every cell of a row reached as a child also carries its recency rank among its parent's children
    # through that foreign key (the batch's `child_rank`: 0 = the latest at the observation time), as a learned
    # row of a small table of rank buckets (model.encoding.rank_buckets), so "the latest order" is one lookup
    # away; False is seed 002
    child_rank: bool = False
    # True: every cell of a row reached through a foreign key also carries that key (the batch's `arrival`: a
    # projection of the key column's name embedding) and whether the row was reached as a parent or a child, so a
    # match's home team and away team, two rows of one table, are told apart; False is seed 000 (a row's parents
    # are a set)
    arrival: bool = True
    # scale of the arrival encoding's initialisation (its projection as the column-name encoder's, times this): 0
    # starts the model as the one without arrival, which learns to read it as it pays; at 1 the key's embedding
    # as large as the cell's own column's slowed the planted parent's-attribute signal (docs/design/decisions.md,
    # "Arrival")
    arrival_init: float = 0.0
    # True: a number also moves its cell along a direction of its own column (x times a learned projection of the
    # column-name embedding), beside the seed's direction shared by every numerical column; False is seed 002
    numeric_by_column: bool = True
    numeric_by_column_init: float = 1.0  # scale of that projection's initialisation (0: starts as the seed's encoder)
    # True: a copy head (model.heads.CopyHead) mixes into each prediction the values of the context's visible cells
    # of the target's column (labels of labelled task rows, the column's other values), by a pointer attention and
    # a gate per type; False is seed 004's heads alone
    copy_head: bool = True
    # what the copy head copies of numbers: "mean" (the pointer's weighted mean of the z-scores, the first form) or
    # "median" (their soft weighted median, model.heads.soft_weighted_median: the answer an MAE-scored task wants
    # from a skewed column's labels; docs/design/decisions.md, "The copy head's numbers")
    copy_numbers: Literal["mean", "median"] = "mean"
    # True: a timestamp is predicted as a reference the model points at among the context's visible timestamp
    # cells plus a finely read offset, gated against the seed's head (model.heads.TimeReference), so "the
    # scheduled time plus a delay" needs no absolute date carried through the model; False is seed 004's absolute
    # timestamp decoder alone
    time_reference: bool = True
    # how the time reference's answer mixes with the absolute head's: "open" (the reference alone whenever a
    # timestamp is visible: an absolute date learnt on the training period cannot reach a later split) or "learned"
    # (a gate from the target's state, the first form, which answered "when next" times days early on the tune
    # databases' validation; docs/design/decisions.md, "The time reference's gate")
    time_reference_gate: Literal["learned", "open"] = "open"
    # True: a "when next" time (a timestamp task with observation times) is the observation time plus the median
    # wait plus a wait in the task's own unit, its loss read in that unit (confluence.sampler.waits; needs
    # time_reference); False: measured on the database's whole time span
    time_wait: bool = True
    # the attention kinds whose softmax also has a learned per-head sink: a virtual key with a learned logit and a
    # zero value, so a query can attend to "nothing" and the output's size tells how many keys matched (softmax
    # alone averages: 3 matching children and 30 give the same output); () is seed 000's softmax
    attention_sink: tuple[Literal["outbound", "inbound", "column"], ...] = ()
    # the link head (model.heads.LinkHead): ranks a link task's target rows, "which rows will this row link to
    # next?" (confluence.links); a model without it answers cell tasks only
    link_head: bool = False
    # True: the link head adds each row's mean encoded state (its values, before the blocks) to the row's final
    # state, and the anchor row's to the question (docs/design/decisions.md, "The link head reads the rows'
    # values"); False: final states alone
    link_values: bool = True

    def __post_init__(self) -> None:
        positive(self, "d_model", "n_layers", "n_heads", "d_t", "d_time", "ffn_multiple", "norm_eps")
        if self.d_model % self.n_heads:
            raise ConfigError("d_model", f"{self.d_model} is not divisible by n_heads={self.n_heads}")
        one_of("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
        for which, problem in kernel_launch_problems(self.kernel_heads, self.kernel_warps, self.n_heads):
            raise ConfigError(f"kernel_{which}", problem)
        one_of("copy_numbers", self.copy_numbers, ("mean", "median"))
        one_of("time_reference_gate", self.time_reference_gate, ("learned", "open"))
        non_negative(self, "category_codes", "numeric_by_column_init", "column_codes", "arrival_init")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def d_ff(self) -> int:
        return ffn_hidden_dim(self.d_model, self.ffn_multiple)


@dataclass(frozen=True)
class LossConfig:
    """The loss of seed 004 and its options (`docs/design/decisions.md`: the median-seeking numeric loss)."""

    # removed after measurement rejected it (docs/design/decisions.md, "Removed settings"): its "off" value still loads
    RETIRED: ClassVar[dict[str, Any]] = {"epoch_loss": "huber", "epoch_median_delta": ANY_VALUE}

    huber_delta: float = 1.0  # Huber's transition (z-units) for numbers and each timestamp component
    ts_scalar_weight: float = 2.0  # weight of a timestamp's epoch term beside the mean of its 14 cyclic terms
    z_loss: float = 1e-4  # weight of the categorical logits' log-sum-exp squared
    max_k: int = 128  # static: the categorical block is padded to this many entries
    numeric_loss: Literal["huber", "median"] = "huber"  # "median": smooth L1, minimised by the conditional median
    median_delta: float = 0.05  # the smooth-L1 transition width (z-units) of numeric_loss="median"

    def __post_init__(self) -> None:
        positive(self, "huber_delta", "median_delta", "max_k")
        one_of("numeric_loss", self.numeric_loss, ("huber", "median"))
        non_negative(self, "ts_scalar_weight", "z_loss")
