"""Synthetic relational databases: planted signals with known answers (`planted`; link signals: `planted_links`), for
measuring what the model learns against the best any predictor can do, and random databases (`random_db`) for
pretraining."""

from confluence.synth.planted import PlantedDatabase, PlantedSpec, generate, write_planted
from confluence.synth.planted_links import (
    PlantedLinksDatabase,
    PlantedLinksSpec,
    generate_links,
    write_planted_links,
)
from confluence.synth.random_db import RandomDatabase, RandomSpec, generate_random, write_random

__all__ = ["PlantedDatabase", "PlantedLinksDatabase", "PlantedLinksSpec", "PlantedSpec", "RandomDatabase",
           "RandomSpec", "generate", "generate_links", "generate_random", "write_planted", "write_planted_links",
           "write_random"]
