"""Synthetic relational databases: planted signals with known answers (`planted`), for measuring what the model
learns against the best any predictor can do, and random databases (`random_db`) for pretraining."""

from confluence.synth.planted import PlantedDatabase, PlantedSpec, generate, write_planted
from confluence.synth.random_db import RandomDatabase, RandomSpec, generate_random, write_random

__all__ = ["PlantedDatabase", "PlantedSpec", "RandomDatabase", "RandomSpec", "generate", "generate_random",
           "write_planted", "write_random"]
