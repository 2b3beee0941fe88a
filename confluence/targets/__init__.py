"""Target kinds: one module per kind of target (numerical, boolean, categorical, timestamp) that owns everything
kind-specific after the batch (`base.TargetKind`). The rest of the package asks `kind(stype)`; it does not branch on
the target's type. A new kind is one module with a `TargetKind` subclass and one line in `KINDS`."""

from __future__ import annotations

from confluence.stypes import SemanticType
from confluence.targets.base import TargetKind, sigmoid, softmax
from confluence.targets.boolean import Boolean
from confluence.targets.categorical import Categorical
from confluence.targets.decode import (
    DecodedTargets,
    TargetRange,
    decode_targets,
    numerical_predictions,
    task_categories,
    train_target_range,
)
from confluence.targets.numerical import Numerical
from confluence.targets.timestamp import Timestamp

KINDS: dict[SemanticType, TargetKind] = {k.stype: k for k in (Numerical(), Boolean(), Categorical(), Timestamp())}


def kind(stype: SemanticType | int) -> TargetKind:
    """The target kind of a semantic type; a ValueError naming it when no target can have that type."""
    st = SemanticType(int(stype))
    if st not in KINDS:
        raise ValueError(f"no target kind for {st.label} values (targets are "
                         f"{', '.join(k.label for k in KINDS.values())})")
    return KINDS[st]


__all__ = ["KINDS", "DecodedTargets", "TargetKind", "TargetRange", "decode_targets", "kind",
           "numerical_predictions", "sigmoid", "softmax", "task_categories", "train_target_range"]
