"""Write the generated reference pages (docs/reference/cli.md, config.md) from the code; tests/test_reference.py
fails when the committed pages are out of date. Usage: python scripts/write_reference.py"""

from pathlib import Path

from confluence.cli.reference import reference_pages

if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "docs" / "reference"
    out.mkdir(parents=True, exist_ok=True)
    for name, text in reference_pages().items():
        (out / name).write_text(text)
        print(f"wrote {out / name} ({len(text.split())} words)")
