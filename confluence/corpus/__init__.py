"""Pretraining corpora: many random databases (and TPC-H at small scale factors) generated and preprocessed
offline into one directory, with a recorded train / held-out split (docs/design/corpus.md).

`build_corpus(out, databases, ...)` builds or finishes one (`confluence corpus build`); `open_corpus(dir)` reads
it back as a `Corpus` whose `train_stores` and `heldout_stores` are the store paths to train and validate on.
"""

from confluence.corpus.build import build_corpus
from confluence.corpus.spec import Corpus, CorpusError, CorpusSpec, Member, open_corpus

__all__ = ["Corpus", "CorpusError", "CorpusSpec", "Member", "build_corpus", "open_corpus"]
