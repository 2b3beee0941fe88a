"""Compare text encoders on a labelled corpus: a linear probe and nearest-neighbour retrieval.

The labelled corpus is a Parquet file with `text` and `package` columns (`confluence text corpus`). Documents of
packages with at least `min_per_class` documents are kept (at most `max_docs`, stratified, seeded), split 70/30
stratified. Probe: logistic regression on standardized embeddings, test accuracy. Retrieval: for each test
document, cosine nearest neighbours among the training documents; kNN@1 = nearest has the same package, MRR =
mean reciprocal rank of the first same-package neighbour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from confluence.errors import ConfluenceError


def _encode_fn(spec: str, train_texts: list[str]) -> tuple[Any, int]:
    """(texts -> float32 embeddings, dim) for an encoder spec."""
    if spec == "tfidf":
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfVectorizer

        vec = TfidfVectorizer(sublinear_tf=True, min_df=2).fit(train_texts)
        dim = min(256, len(vec.vocabulary_) - 1)
        svd = TruncatedSVD(dim, random_state=0).fit(vec.transform(train_texts))
        return (lambda t: svd.transform(vec.transform(t)).astype(np.float32)), dim
    from confluence.textenc.registry import load_encoder
    from confluence.textmodel.encoder import LejepaTextEncoder

    if spec.startswith("random:"):
        enc = LejepaTextEncoder(spec.removeprefix("random:"), untrained=True)
        return enc.encode, enc.dim
    if Path(spec).is_dir():
        enc = LejepaTextEncoder(spec)
        return enc.encode, enc.dim
    enc = load_encoder(spec)
    return enc.encode, enc.dim


def select_docs(corpus: str | Path, max_docs: int, min_per_class: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Texts and integer labels of the probe set (deterministic)."""
    import pyarrow.parquet as pq

    t = pq.read_table(corpus, columns=["text", "package"])
    texts, labels = t.column("text").to_pylist(), np.array(t.column("package").to_pylist())
    names, counts = np.unique(labels, return_counts=True)
    keep = set(names[counts >= min_per_class])
    if len(keep) < 2:
        raise ConfluenceError(f"corpus {corpus}: fewer than 2 packages with >= {min_per_class} documents")
    idx = np.array([i for i, lab in enumerate(labels) if lab in keep])
    rng = np.random.default_rng(seed)
    if len(idx) > max_docs:
        from sklearn.model_selection import train_test_split

        idx, _ = train_test_split(idx, train_size=max_docs, stratify=labels[idx], random_state=seed)
    idx = np.sort(idx)
    rng.shuffle(idx)
    classes = sorted(keep)
    y = np.array([classes.index(lab) for lab in labels[idx]])
    return [texts[i] for i in idx], y


def retrieval_scores(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray) -> tuple[float, float]:
    """(kNN@1 accuracy, MRR of the first same-label neighbour) under cosine similarity."""
    a = train_x / np.maximum(np.linalg.norm(train_x, axis=1, keepdims=True), 1e-9)
    b = test_x / np.maximum(np.linalg.norm(test_x, axis=1, keepdims=True), 1e-9)
    order = np.argsort(-(b @ a.T), axis=1, kind="stable")
    same = train_y[order] == test_y[:, None]
    first = np.argmax(same, axis=1)
    return float(np.mean(same[:, 0])), float(np.mean(1.0 / (first + 1)))


def run_probe(corpus: str | Path, encoders: list[str], *, max_docs: int = 3000, min_per_class: int = 40,
              seed: int = 0) -> list[dict[str, Any]]:
    """One row per encoder: encoder, dim, probe_acc, knn1, mrr, num_train, num_test, num_classes."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    texts, y = select_docs(corpus, max_docs, min_per_class, seed)
    tr, te = train_test_split(np.arange(len(texts)), test_size=0.3, stratify=y, random_state=seed)
    rows = []
    for spec in encoders:
        fn, dim = _encode_fn(spec, [texts[i] for i in tr])
        x = np.asarray(fn(texts), np.float32)
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
        clf.fit(x[tr], y[tr])
        acc = float(np.mean(clf.predict(x[te]) == y[te]))
        knn1, mrr = retrieval_scores(x[tr], y[tr], x[te], y[te])
        rows.append({"encoder": spec, "dim": dim, "probe_acc": acc, "knn1": knn1, "mrr": mrr,
                     "num_train": len(tr), "num_test": len(te), "num_classes": int(y.max() + 1)})
    return rows
