"""The seven semantic types (spec/semantic_types.md), stored as int8 in this exact order."""

from __future__ import annotations

from enum import IntEnum


class SemanticType(IntEnum):
    IDENTIFIER = 0
    NUMERICAL = 1
    TIMESTAMP = 2
    BOOLEAN = 3
    CATEGORICAL = 4
    TEXT = 5
    IGNORED = 6

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> SemanticType:
        """Parse a metadata stype string ("numerical", ...); raises ValueError naming the valid choices."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            choices = ", ".join(t.label for t in cls)
            raise ValueError(f"unknown stype {name!r} (expected one of: {choices})") from None

    @property
    def can_be_target(self) -> bool:
        return self in TARGET_STYPES


TARGET_STYPES = frozenset(
    {SemanticType.NUMERICAL, SemanticType.TIMESTAMP, SemanticType.BOOLEAN, SemanticType.CATEGORICAL}
)

# Number of floats in a timestamp encoding: 7 (sin, cos) pairs + the z-scored epoch value.
D_TIME = 15
US_PER_SECOND = 1_000_000  # times are epoch microseconds everywhere (store, batches, tasks)
US_PER_DAY = 86_400 * US_PER_SECOND
