"""The course's registry (course.toml) and what is generated from it.

``course.toml`` is the one place a lesson or an exercise is declared. From it this module writes the table of
contents (``_toc.yml``), the chapter map with its exercise links in ``intro.md``, the lesson sections of the
library reference (``chapters/api.md``) and, through :mod:`tests.book.pitfalls`, the index of common pitfalls
(``chapters/pitfalls.md``). Regenerate everything with ``.venv/bin/python -m tests.book.registry``; the tests
in ``tests/notebooks/test_structure.py`` fail when a generated part is out of date.

In a Markdown page, the generated part sits between two MyST comment lines (``% BEGIN ...`` and ``% END ...``);
the rest of the page is written by hand.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the package depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "course.toml"
COMMAND = ".venv/bin/python -m tests.book.registry"


@dataclass(frozen=True)
class ApiSection:
    title: str
    text: str
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Lesson:
    file: str  # "chapters/NN_topic", without the extension
    number: str
    title: str
    builds: str
    part: str
    exercise: str | None = None  # "exercises/solutions/exNN_topic"
    pitfall: bool = True
    api: ApiSection | None = None

    @property
    def stem(self) -> str:
        return self.file.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Course:
    parts: tuple[str, ...]
    lessons: tuple[Lesson, ...]
    extra_exercises: tuple[str, ...] = ()
    reference: tuple[str, ...] = field(default_factory=tuple)

    @property
    def exercises(self) -> tuple[str, ...]:
        return tuple(lesson.exercise for lesson in self.lessons if lesson.exercise) + self.extra_exercises


_LESSON_KEYS = {"file", "number", "title", "builds", "exercise", "pitfall", "api"}


def load(root: Path = ROOT) -> Course:
    """Read and check ``course.toml``: unknown keys and missing fields are errors that name the entry."""
    data = tomllib.loads((root / REGISTRY).read_text(encoding="utf-8"))
    unknown = set(data) - {"parts", "extra_exercises", "reference"}
    if unknown:
        raise ValueError(f"{REGISTRY}: unknown top-level keys {sorted(unknown)}")
    parts, lessons = [], []
    for part in data.get("parts", []):
        caption = part.get("caption")
        if not caption:
            raise ValueError(f"{REGISTRY}: a [[parts]] entry has no caption")
        parts.append(caption)
        for entry in part.get("lessons", []):
            where = f"{REGISTRY}: lesson {entry.get('file', '?')!r}"
            if set(entry) - _LESSON_KEYS:
                raise ValueError(f"{where}: unknown keys {sorted(set(entry) - _LESSON_KEYS)}")
            missing = [key for key in ("file", "number", "title", "builds") if not entry.get(key)]
            if missing:
                raise ValueError(f"{where}: missing {missing}")
            api = entry.get("api")
            if api is not None:
                if set(api) != {"title", "text", "modules"}:
                    raise ValueError(f"{where}: [api] needs exactly title, text and modules, got {sorted(api)}")
                api = ApiSection(api["title"], api["text"].strip(), tuple(api["modules"]))
            lessons.append(Lesson(entry["file"], str(entry["number"]), entry["title"], entry["builds"], caption,
                                  entry.get("exercise"), bool(entry.get("pitfall", True)), api))
    return Course(tuple(parts), tuple(lessons), tuple(data.get("extra_exercises", ())),
                  tuple(data.get("reference", ())))


def notebook_or_page(root: Path, entry: str) -> Path | None:
    for suffix in (".ipynb", ".md"):
        if (root / f"{entry}{suffix}").exists():
            return root / f"{entry}{suffix}"
    return None


# ---------------------------------------------------------------------------------------------------------
# _toc.yml
# ---------------------------------------------------------------------------------------------------------
def render_toc(course: Course) -> str:
    lines = [
        f"# Generated from {REGISTRY} by `{COMMAND}`: edit {REGISTRY}, never this file.",
        "# Lessons are numbered in teaching order; each lesson's exercise is listed under \"Exercises\".",
        "format: jb-book",
        "root: intro",
        "parts:",
    ]

    def part(caption: str, files: list[str]) -> None:
        lines.append(f"  - caption: {caption}")
        lines.append("    chapters:")
        lines.extend(f"      - file: {file}" for file in files)

    for caption in course.parts:
        part(caption, [lesson.file for lesson in course.lessons if lesson.part == caption])
    if course.exercises:
        part("Exercises (with solutions)", list(course.exercises))
    if course.reference:
        part("Reference", list(course.reference))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------
# The generated parts of Markdown pages
# ---------------------------------------------------------------------------------------------------------
def _markers(name: str) -> tuple[str, str]:
    return (f"% BEGIN {name}: generated from {REGISTRY} by `{COMMAND}`; do not edit by hand",
            f"% END {name}")


def replace_block(text: str, name: str, body: str, page: str) -> str:
    """``text`` with the lines between the ``name`` markers replaced by ``body``."""
    begin, end = _markers(name)
    pattern = re.compile(rf"^% BEGIN {re.escape(name)}:.*?^% END {re.escape(name)}$", re.MULTILINE | re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"{page} has no generated block {name!r}: it needs the lines\n{begin}\n{end}")
    return pattern.sub(lambda _: f"{begin}\n\n{body.strip()}\n\n{end}", text, count=1)


def _link(entry: str, root: Path) -> str:
    path = notebook_or_page(root, entry)
    return f"{entry}{path.suffix if path else '.ipynb'}"


def _ranges(numbers: list[int]) -> str:
    """[2, 3, 4, 13, 14] -> '2 to 4 and 13 to 14'."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    words = [f"{run[0]} to {run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def render_chapter_map(course: Course, root: Path = ROOT) -> str:
    lines = ["| No. | Chapter | You will build | Exercise |", "|---|---|---|---|"]
    for lesson in course.lessons:
        exercise = f"[exercise]({lesson.exercise}.ipynb)" if lesson.exercise else ""
        lines.append(f"| {lesson.number} | [{lesson.title}]({_link(lesson.file, root)}) | {lesson.builds} "
                     f"| {exercise} |")
    with_exercise = [int(lesson.number) for lesson in course.lessons
                     if lesson.exercise and lesson.number.isdigit()]
    lines.append("")
    sentence = f"Chapters {_ranges(with_exercise)} each have a graded exercise" if with_exercise else ""
    extras = [f"[{Path(extra).name.removeprefix('ex_').replace('_', ' ')}]({extra}.ipynb)"
              for extra in course.extra_exercises]
    if extras:
        sentence += f", and the {' and the '.join(extras)} is one more"
    if sentence:
        lines.append(sentence + ".")
    return "\n".join(lines)


def render_api_sections(course: Course) -> str:
    sections = []
    for lesson in course.lessons:
        if lesson.api is None:
            continue
        directives = "\n\n".join(f".. automodule:: {module}\n   :members:\n   :show-inheritance:"
                                 for module in lesson.api.modules)
        sections.append(f"## {lesson.api.title}\n\n{lesson.api.text}\nTaught in {{doc}}`{lesson.stem}`.\n\n"
                        f"```{{eval-rst}}\n{directives}\n```")
    return "\n\n".join(sections)


def generated_files(root: Path = ROOT) -> dict[Path, str]:
    """Every file the registry writes, with the text it must have."""
    from tests.book import pitfalls

    course = load(root)
    intro = (root / "intro.md").read_text(encoding="utf-8")
    api = (root / "chapters" / "api.md").read_text(encoding="utf-8")
    return {
        root / "_toc.yml": render_toc(course),
        root / "intro.md": replace_block(intro, "chapter map", render_chapter_map(course, root), "intro.md"),
        root / "chapters" / "api.md": replace_block(api, "lesson sections", render_api_sections(course),
                                                    "chapters/api.md"),
        root / "chapters" / "pitfalls.md": pitfalls.render(root),
    }


def main() -> None:
    for path, text in generated_files(ROOT).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
