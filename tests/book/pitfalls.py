"""The index of "Common pitfall" notes: collected from the lessons into chapters/pitfalls.md.

The lessons are those of the registry (course.toml), in its order. Regenerate with
``.venv/bin/python -m tests.book.registry`` (which writes every generated page) or ``python -m tests.book.pitfalls``;
a test fails when the page is out of date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "chapters" / "pitfalls.md"
PITFALL = re.compile(r"^:::+\{admonition\}\s*Common pitfall:\s*(?P<title>.+?)\s*$", re.MULTILINE)

HEADER = """# Common pitfalls

Mistakes that published tutorials, lecture notes and papers' transcriptions make about attention, each
explained and corrected in the lesson linked beside it. Every lesson flags its pitfalls in a warning box
titled *Common pitfall*; this page is generated from those boxes.

"""


def lesson_title(notebook) -> str:
    first = notebook.cells[0].source.splitlines()[0]
    return first.removeprefix("# ").strip()


def collect(root: Path = ROOT) -> list[tuple[str, str, list[str]]]:
    """(lesson stem, lesson title, pitfall titles) for every lesson with at least one pitfall."""
    from tests.book import registry

    found = []
    for lesson in registry.load(root).lessons:
        path = root / f"{lesson.file}.ipynb"
        if not path.exists():
            continue
        notebook = nbformat.read(path, as_version=4)
        titles = [
            match.group("title")
            for cell in notebook.cells
            if cell.cell_type == "markdown"
            for match in PITFALL.finditer(cell.source)
        ]
        if titles:
            found.append((path.stem, lesson_title(notebook), titles))
    return found


def render(root: Path = ROOT) -> str:
    lines = [HEADER.rstrip("\n"), ""]
    for stem, title, pitfalls in collect(root):
        lines.append(f"## {title}")
        lines.append("")
        lines.extend(f"- {pitfall} ({{doc}}`{stem}`)" for pitfall in pitfalls)
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)} with {sum(len(p) for _, _, p in collect())} pitfalls", file=sys.stderr)
