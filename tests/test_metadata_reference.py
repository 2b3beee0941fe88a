"""docs/reference/metadata.md names every field the metadata parser accepts, and its complete example parses: the
reference cannot fall behind the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from confluence.schema import metadata as M
from confluence.stypes import SemanticType

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "metadata.md"


def _named(text: str) -> set[str]:
    """The names the page writes as code (`name`)."""
    return set(re.findall(r"`([^`\s]+)`", text))


def test_the_reference_names_every_field_the_parser_accepts():
    text = PAGE.read_text(encoding="utf-8")
    named = _named(text)
    accepted = {*M.DATABASE_FIELDS, *M.TABLE_FIELDS, *M.COLUMN_FIELDS, *M.TASK_FIELDS, *M.LINK_TASK_FIELDS,
                *M.SPLIT_FIELDS}
    assert accepted - named == set(), f"fields the parser accepts but {PAGE.name} does not describe"
    stypes = {t.label for t in SemanticType}
    assert stypes - named == set(), f"stypes {PAGE.name} does not describe"
    assert set(M.HORIZON_UNITS) - named == set(), f"horizon units {PAGE.name} does not name"
    for name in ("README.md", "docs/design/data_sources_and_metadata.md"):  # the page is found from where users start
        assert "docs/reference/metadata.md" in (ROOT / name).read_text(encoding="utf-8"), name


def test_the_complete_example_parses_and_uses_every_field():
    text = PAGE.read_text(encoding="utf-8")
    example = json.loads(re.search(r"## A complete example.*?```json\n(.*?)```", text, re.S).group(1))
    meta = M.parse_metadata(example, source=PAGE.name)  # raises MetadataError naming every problem
    used: set[str] = set(example)
    for table in example["tables"].values():
        used |= set(table)
        for column in table["columns"].values():
            used |= set(column)
    for task in [*example["tasks"].values(), *example.get("link_tasks", {}).values()]:
        used |= set(task) | set(task.get("split", {}))
    accepted = {*M.DATABASE_FIELDS, *M.TABLE_FIELDS, *M.COLUMN_FIELDS, *M.TASK_FIELDS, *M.LINK_TASK_FIELDS,
                *M.SPLIT_FIELDS}
    assert accepted - used == set(), "the complete example leaves fields out"
    assert {c.stype.label for t in meta.tables.values() for c in t.columns.values()} == {t.label for t in SemanticType}
    kinds = {name: task.is_cell_masking(meta) for name, task in meta.tasks.items()}
    assert sorted(kinds.values()) == [False, True], kinds  # one cell-masking task, one derived
