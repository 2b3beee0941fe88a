"""Frozen text encoders used by preprocessing (column names, category strings, text cells)."""

from confluence.textenc.base import TextEncoder

__all__ = ["TextEncoder"]
