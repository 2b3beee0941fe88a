"""Preprocessing: raw database + metadata -> processed store (see docs/design/preprocessing.md)."""

from confluence.preprocess.pipeline import DEFAULT_MEMORY_LIMIT_MB, preprocess

__all__ = ["DEFAULT_MEMORY_LIMIT_MB", "preprocess"]
