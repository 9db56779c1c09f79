"""Reading the built site: pages, links, images, the runtime table.

The site tests run on the site named by the environment variable ``COURSE_SITE`` (``make test`` sets it to
``_build/html``; point it at another build, e.g. a small test book, to check that one). A bare ``pytest``
leaves it unset and skips them with the reason, so a fresh clone's ``pytest`` runs without a built site.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]
SITE_ENV = "COURSE_SITE"
HTML = Path(os.environ.get(SITE_ENV) or ROOT / "_build" / "html").resolve()
# The book the site was built from: the folder holding _build/ (the repository, or a test book elsewhere).
BOOK = HTML.parents[1] if (HTML.parents[1] / "_toc.yml").exists() else ROOT

# Budgets in seconds of kernel CPU time on the reference machine (_ext/cpu_calibration.py converts what this
# machine measured; COURSE.md "Performance budgets": each lesson <= 90 s, the whole book,
# twenty lessons and the exercise solutions, <= 11 min on 2 cores). The pages they apply to are read from
# _toc.yml, so a new lesson is checked as soon as it is listed there.
LESSON_BUDGET_SECONDS = 90.0
BOOK_BUDGET_SECONDS = 660.0


def require_site() -> None:
    """Skip the calling test module on a bare ``pytest`` run; fail it when the site was asked for but is missing."""
    if not os.environ.get(SITE_ENV):
        pytest.skip(
            f"site tests need the built book: `make test` runs them ({SITE_ENV}=_build/html pytest tests/book "
            "tests/browser)",
            allow_module_level=True,
        )
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} holds no built book: run `make book` first", pytrace=False)


def toc_entries() -> list[str]:
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text())
    entries = [toc["root"]]
    for part in toc["parts"]:
        entries.extend(chapter["file"] for chapter in part["chapters"])
    return entries


def notebook_entries() -> list[str]:
    return [entry for entry in toc_entries() if (BOOK / f"{entry}.ipynb").exists()]


def learner_notebook(entry: str) -> str | None:
    """``exercises/exNN_x`` for the solution page ``exercises/solutions/exNN_x``; None for other pages."""
    prefix = "exercises/solutions/"
    return "exercises/" + entry.removeprefix(prefix) if entry.startswith(prefix) else None


def html_pages() -> list[Path]:
    if not HTML.is_dir():
        return []
    return sorted(path for path in HTML.rglob("*.html") if "_static" not in path.parts and "_sources" not in path.parts)


@cache
def soup(path: Path) -> BeautifulSoup:
    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def page_for(entry: str) -> Path:
    return HTML / f"{entry}.html"


def main_content(page: Path):
    """The page's <main>, without the theme's print-only copy of the title (a second, hidden h1)."""
    document = BeautifulSoup(str(soup(page).find("main") or soup(page)), "html.parser")
    for print_only in document.select(".onlyprint"):
        print_only.decompose()
    return document


def internal_links(page: Path) -> list[tuple[str, Path, str]]:
    """(href, target file, fragment) for every link from ``page`` that stays inside the site."""
    links = []
    for anchor in soup(page).find_all("a", href=True):
        href = anchor["href"]
        parts = urlsplit(href)
        if parts.scheme or href.startswith(("mailto:", "javascript:", "//")):
            continue
        target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
        if target.is_dir():
            target = target / "index.html"
        links.append((href, target, unquote(parts.fragment)))
    return links


@cache  # the API page alone links to its own anchors thousands of times
def anchors_in(page: Path) -> frozenset[str]:
    document = soup(page)
    return frozenset(tag["id"] for tag in document.find_all(id=True)) | {
        tag["name"] for tag in document.find_all("a", attrs={"name": True})
    }


def cpu_times() -> dict[str, dict[str, float]]:
    """``{document: {"cpu_s": kernel CPU seconds, "wall_s": wall seconds, "calibration_cpu_s": the machine's
    calibration then, "reference_cpu_s": the kernel CPU in the reference machine's seconds}}``, measured by
    _ext/course_site.py (_ext/cpu_calibration.py converts)."""
    path = HTML / "cpu-times.json"
    if not path.exists():
        raise AssertionError(f"{path} is missing: the course_site extension measures every executed notebook")
    return json.loads(path.read_text())


def runtimes() -> dict[str, float]:
    """Wall seconds each executed document took, read from MyST-NB's execution table."""
    tables = soup(HTML / "chapters" / "runtimes.html").find_all("table")
    table = next((t for t in tables if t.find("th", string="Run Time (s)")), None)
    if table is None:
        raise AssertionError("the runtime page has no execution table")
    header = [cell.get_text(strip=True) for cell in table.find("thead").find_all("th")]
    document_column, time_column, status_column = (
        header.index("Document"),
        header.index("Run Time (s)"),
        header.index("Status"),
    )
    result = {}
    for row in table.find("tbody").find_all("tr"):
        cells = [cell.get_text(strip=True) for cell in row.find_all("td")]
        if cells[status_column] != "✅":
            raise AssertionError(f"{cells[document_column]} did not execute cleanly: status {cells[status_column]!r}")
        result[cells[document_column]] = float(cells[time_column])
    return result
