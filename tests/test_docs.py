"""The documentation holds together: every relative link of README.md and docs/ reaches a file (and a heading of
it, where it names one; a bare #anchor, a heading of its own page), every `docs/...` path that a page or the code names exists, and the user pages
(docs/guide/ and docs/reference/) read in under an hour: at most 25,000 words together. docs/README.md says what
each section is for."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
USER_WORDS = 25_000  # the budget for the guide and the reference: about an hour's reading

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# a path under docs/ as text names it: a file (a name with an extension) or a folder (ending in /); not part of a
# longer path or word (`/docs` the endpoint, `--docs` the option, another repository's docs/)
MENTION = re.compile(r"(?<![\w/.-])docs/(?:[\w.-]+/)*(?:[\w-][\w.-]*\.\w+)?")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _prose(text: str) -> str:
    """A markdown text without its code blocks and code spans."""
    return CODE.sub("", FENCE.sub("", text))


@cache
def _anchors(page: Path) -> frozenset[str]:
    """The anchors of a page's headings, as GitHub writes them (lower case, punctuation dropped, spaces to -)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} (.*)$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return frozenset(seen)


def test_every_relative_link_reaches_a_file():
    broken = []
    for page in _pages():
        for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
            if re.match(r"^(https?:|mailto:)", target):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.resolve()):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that reach nothing:\n" + "\n".join(broken)


def _mentions() -> list[tuple[Path, str]]:
    sources = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    sources += [p for p in sorted(DOCS.rglob("*.md")) if DOCS / "lab" not in p.parents]  # lab: dated records
    sources += [p for d in ("confluence", "tests", "scripts", "examples") for p in sorted((ROOT / d).rglob("*.py"))]
    sources += sorted((ROOT / "confluence" / "configs").glob("*.toml")) + sorted((ROOT / "scripts").glob("*.sh"))
    return [(p, m) for p in sources for m in MENTION.findall(p.read_text(encoding="utf-8"))]


def test_every_docs_path_named_exists():
    mentions = _mentions()
    assert len(mentions) > 100  # the pattern does find what the pages and the code name
    missing = sorted({f"{p.relative_to(ROOT)}: {m}" for p, m in mentions if not (ROOT / m).exists()})
    assert not missing, "docs/ paths that name no file:\n" + "\n".join(missing)


def test_the_user_pages_read_in_under_an_hour():
    pages = sorted([*(DOCS / "guide").rglob("*.md"), *(DOCS / "reference").rglob("*.md")])
    words = {str(p.relative_to(DOCS)): len(p.read_text(encoding="utf-8").split()) for p in pages}
    total = sum(words.values())
    per_page = ", ".join(f"{name} {n}" for name, n in sorted(words.items(), key=lambda kv: -kv[1]))
    assert total <= USER_WORDS, (f"docs/guide/ and docs/reference/ hold {total} words, over {USER_WORDS}: move "
                                 f"design or measurement material to docs/design/ ({per_page})")
