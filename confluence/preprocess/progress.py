"""Progress reporting for long preprocessing steps: the shared `Reporter` (kept here for existing imports)."""

from confluence.toolkit.progress import Reporter

__all__ = ["Reporter"]
