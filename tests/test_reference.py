"""The generated reference pages (docs/reference/) say what the code says: regenerate them with
`python scripts/write_reference.py` after changing a command's help, a setting or its comment."""

from pathlib import Path

import pytest

from confluence.cli.reference import reference_pages

DOCS = Path(__file__).resolve().parent.parent / "docs" / "reference"


@pytest.mark.parametrize("name", ["cli.md", "config.md"])
def test_committed_reference_page_is_up_to_date(name):
    page = reference_pages()[name]
    committed = (DOCS / name).read_text()
    assert committed == page, f"docs/reference/{name} is out of date: run `python scripts/write_reference.py`"


def test_reference_covers_every_command_and_setting():
    import dataclasses

    from confluence.training.config import RunConfig

    pages = reference_pages()
    for cmd in ("confluence train", "confluence evaluate", "confluence predict", "confluence serve",
                "confluence bench quality", "confluence corpus build"):
        assert f"\n## {cmd}\n" in pages["cli.md"], cmd
    cfg = RunConfig()
    for section in ("model", "sampler", "optim", "loss", "loop"):
        for f in dataclasses.fields(getattr(cfg, section)):
            if not dataclasses.is_dataclass(getattr(getattr(cfg, section), f.name)):
                assert f"| `{f.name}` |" in pages["config.md"], (section, f.name)
