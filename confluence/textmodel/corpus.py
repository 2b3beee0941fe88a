"""An offline, reproducible text corpus: the docstrings of the Python standard library, labelled by package.

Read with `ast` from the interpreter's own source files (nothing is imported or downloaded), in sorted file order,
so the corpus depends only on the Python version. The package label (`json`, `email`, `asyncio`, ...) makes a
simple linear-probe / retrieval check of text embeddings possible.
"""

from __future__ import annotations

import ast
import sys
import sysconfig
from pathlib import Path

from confluence.errors import ConfluenceError

_SKIP = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "dist-packages", "ensurepip",
         "__pycache__", "pydoc_data", "tkinter"}


def stdlib_docstrings(min_chars: int = 40, max_chars: int = 2000) -> list[tuple[str, str]]:
    """(docstring, top-level package) pairs of the standard library's module, class and function docstrings.

    Whitespace is collapsed; docstrings shorter than `min_chars` are dropped and longer ones cut to their first
    `max_chars` characters. Deterministic for a Python version.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ConfluenceError(f"the standard library sources are not at {root}")
    out: list[tuple[str, str]] = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if any(part in _SKIP for part in rel.parts) or rel.parts[0].startswith("_"):
            continue
        label = rel.parts[0].removesuffix(".py")
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        for node in nodes:
            doc = ast.get_docstring(node)
            if not doc:
                continue
            text = " ".join(doc.split())
            if len(text) >= min_chars:
                out.append((text[:max_chars], label))
    return out


def write_stdlib_corpus(out: str | Path, min_chars: int = 40) -> Path:
    """Write the stdlib docstring corpus as a Parquet file with columns `text` and `package`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pairs = stdlib_docstrings(min_chars)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"text": [t for t, _ in pairs], "package": [p for _, p in pairs]})
    table = table.replace_schema_metadata({"python": sys.version.split()[0], "source": "stdlib docstrings"})
    pq.write_table(table, out)
    return out
