"""Every lesson has a "Common pitfall" note, and the index page lists them all."""

from __future__ import annotations

import pytest

from tests.book import pitfalls
from tests.notebooks.notebook_files import LESSONS, relative


def test_pitfall_index_is_up_to_date():
    assert pitfalls.PAGE.exists(), "chapters/pitfalls.md is missing: run .venv/bin/python -m tests.book.pitfalls"
    assert pitfalls.PAGE.read_text() == pitfalls.render(), (
        "chapters/pitfalls.md is out of date with the lessons: run .venv/bin/python -m tests.book.pitfalls"
    )


@pytest.mark.parametrize("path", [p for p in LESSONS if p.stem != "12_transformer_at_scale"], ids=relative)
def test_lesson_has_a_common_pitfall_note(path):
    stems = {stem for stem, _, _ in pitfalls.collect()}
    assert path.stem in stems, f"{relative(path)} has no 'Common pitfall' admonition"
