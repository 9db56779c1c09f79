"""Reading the built site in _build/html: pages, links, images, the runtime table."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"

LESSON_BUDGET_SECONDS = 90.0
BOOK_BUDGET_SECONDS = 360.0


def toc_entries() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = [toc["root"]]
    for part in toc["parts"]:
        entries.extend(chapter["file"] for chapter in part["chapters"])
    return entries


def notebook_entries() -> list[str]:
    return [entry for entry in toc_entries() if (ROOT / f"{entry}.ipynb").exists()]


def html_pages() -> list[Path]:
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


def runtimes() -> dict[str, float]:
    """Seconds each executed document took, read from the build's own execution table."""
    table = soup(HTML / "chapters" / "runtimes.html").find("table")
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
