"""Every lesson has a "Common pitfall" note, and the index page lists them all."""

from __future__ import annotations

import pytest

from tests.book import pitfalls, registry
from tests.notebooks.notebook_files import ROOT, relative

# A lesson without a pitfall box says so in course.toml (pitfall = false).
LESSONS_WITH_PITFALLS = [
    ROOT / f"{lesson.file}.ipynb"
    for lesson in registry.load().lessons
    if lesson.pitfall and (ROOT / f"{lesson.file}.ipynb").exists()
]


def test_pitfall_index_is_up_to_date():
    assert pitfalls.PAGE.exists(), "chapters/pitfalls.md is missing: run .venv/bin/python -m tests.book.registry"
    assert pitfalls.PAGE.read_text() == pitfalls.render(), (
        "chapters/pitfalls.md is out of date with the lessons: run .venv/bin/python -m tests.book.registry"
    )


@pytest.mark.parametrize("path", LESSONS_WITH_PITFALLS, ids=relative)
def test_lesson_has_a_common_pitfall_note(path):
    stems = {stem for stem, _, _ in pitfalls.collect()}
    assert path.stem in stems, f"{relative(path)} has no 'Common pitfall' admonition"
