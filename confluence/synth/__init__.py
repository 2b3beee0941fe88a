"""Synthetic relational databases with known answers: planted signals (`planted`), for measuring what the model
learns against the best any predictor can do."""

from confluence.synth.planted import PlantedDatabase, PlantedSpec, generate, write_planted

__all__ = ["PlantedDatabase", "PlantedSpec", "generate", "write_planted"]
