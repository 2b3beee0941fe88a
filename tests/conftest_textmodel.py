"""Fixtures of the text-model tests. Import explicitly: `from tests.conftest_textmodel import write_tiny_corpus`."""

from __future__ import annotations

from pathlib import Path

import numpy as np

_SUBJECTS = ["the flight", "a passenger", "the airport", "our pilot", "the crew", "this airline", "the weather",
             "a delayed plane", "the runway", "every ticket"]
_VERBS = ["departs from", "arrives at", "waits near", "lands on", "leaves", "is listed for", "serves", "reaches"]
_OBJECTS = ["gate {n}", "terminal {n}", "Newark at {n} pm", "JFK after {n} minutes", "LaGuardia on day {n}",
            "the hangar {n}", "runway {n} left", "the city by {n}"]


def tiny_sentences(n: int, seed: int = 0) -> list[str]:
    """`n` short synthetic sentences (deterministic): templated subject / verb / object with numbers."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 4))
        parts = []
        for _ in range(k):
            s = _SUBJECTS[rng.integers(len(_SUBJECTS))]
            v = _VERBS[rng.integers(len(_VERBS))]
            o = _OBJECTS[rng.integers(len(_OBJECTS))].format(n=int(rng.integers(1, 40)))
            parts.append(f"{s} {v} {o}.")
        out.append(" ".join(parts).capitalize())
    return out


def write_tiny_corpus(directory: Path, n: int = 400, seed: int = 0) -> Path:
    """A directory with two text files of blank-line separated paragraphs; returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    sents = tiny_sentences(n, seed)
    half = n // 2
    (directory / "a.txt").write_text("\n\n".join(sents[:half]) + "\n", encoding="utf-8")
    (directory / "b.md").write_text("\n\n".join(sents[half:]) + "\n", encoding="utf-8")
    return directory
