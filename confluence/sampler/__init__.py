"""Sampler: turns task seeds into TrainingBatches (spec/sampling.md, seed 000 "Batch Structure")."""

from confluence.sampler.batch import TrainingBatch

__all__ = ["TrainingBatch"]
