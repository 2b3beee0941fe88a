"""Confluence: a foundation-model system for relational databases.

Data flow (one subpackage per stage):

    sources  -> schema (metadata) -> preprocess -> store -> sampler -> model / training -> evaluation
    textenc  (frozen text encoder used by preprocess)     textmodel (LeJEPA text base model, seed 003)
"""

__version__ = "0.1.0"
