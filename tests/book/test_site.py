"""The built book (`make book` output in _build/html), checked offline: pages, links, images, runtimes."""

from __future__ import annotations

import re

import pytest

from tests.book.site import (
    BOOK_BUDGET_SECONDS,
    HTML,
    LESSON_BUDGET_SECONDS,
    anchors_in,
    html_pages,
    internal_links,
    main_content,
    notebook_entries,
    page_for,
    runtimes,
    soup,
    toc_entries,
)

pytestmark = pytest.mark.book

if not (HTML / "index.html").exists():
    pytest.fail("_build/html is missing: run `make book` before the site tests", pytrace=False)


@pytest.mark.parametrize("entry", toc_entries())
def test_every_toc_entry_is_built(entry):
    assert page_for(entry).exists(), f"{entry} is in _toc.yml but {page_for(entry)} was not built"


@pytest.mark.parametrize("entry", notebook_entries())
def test_colab_button_opens_this_notebook_on_main(entry, repository_url):
    github_path = repository_url.removeprefix("https://github.com/")
    expected = f"https://colab.research.google.com/github/{github_path}/blob/main/{entry}.ipynb"
    links = [
        a["href"] for a in soup(page_for(entry)).find_all("a", href=True) if "colab.research.google.com" in a["href"]
    ]
    assert links == [expected], f"{entry}: Colab links {links}, expected exactly {expected}"


@pytest.mark.parametrize("entry", notebook_entries())
def test_download_button_offers_the_notebook(entry):
    hrefs = [a["href"] for a in soup(page_for(entry)).find_all("a", href=True)]
    downloads = [href for href in hrefs if href.endswith(f"{entry.split('/')[-1]}.ipynb") and "_sources" in href]
    assert downloads, f"{entry}: no download link to the .ipynb source"
    target = (page_for(entry).parent / downloads[0]).resolve()
    assert target.exists(), f"{entry}: the download link {downloads[0]} points at a missing file"


@pytest.mark.parametrize("page", html_pages(), ids=lambda p: p.relative_to(HTML).as_posix())
def test_every_image_has_alt_text(page):
    for image in main_content(page).find_all("img"):
        alt = (image.get("alt") or "").strip()
        assert alt, f"{page.relative_to(HTML)}: image {image.get('src')} has no alt text"
        assert not re.fullmatch(r"(_build/)?[\w/.-]+\.(png|svg|jpg)", alt), f"alt text is a file name: {alt!r}"


@pytest.mark.parametrize("page", html_pages(), ids=lambda p: p.relative_to(HTML).as_posix())
def test_internal_links_and_anchors_resolve(page):
    broken = []
    for href, target, fragment in internal_links(page):
        if not target.exists():
            broken.append(f"{href} (no file {target.relative_to(HTML) if target.is_relative_to(HTML) else target})")
        elif fragment and target.suffix == ".html" and fragment not in anchors_in(target):
            broken.append(f"{href} (no anchor #{fragment})")
    assert not broken, f"{page.relative_to(HTML)} has broken links: {broken}"


@pytest.mark.parametrize("entry", toc_entries())
def test_heading_levels_never_skip(entry):
    """Headings go h1, h2, h3 in order, never jumping a level (screen readers navigate by them)."""
    levels = [int(tag.name[1]) for tag in main_content(page_for(entry)).find_all(re.compile(r"^h[1-6]$"))]
    assert levels and levels[0] == 1, f"{entry}: the page must start with one h1, got {levels[:3]}"
    assert levels.count(1) == 1, f"{entry}: more than one h1"
    for before, after in zip(levels, levels[1:]):
        assert after <= before + 1, f"{entry}: heading level jumps from h{before} to h{after}"


def test_runtime_table_lists_every_notebook():
    executed = runtimes()
    for entry in notebook_entries():
        assert entry in executed, f"{entry} is missing from the runtime table"


@pytest.mark.parametrize("entry", notebook_entries())
def test_each_notebook_runs_within_its_budget(entry):
    seconds = runtimes()[entry]
    print(f"{entry}: {seconds:.1f} s")
    assert seconds <= LESSON_BUDGET_SECONDS, (
        f"{entry} took {seconds:.1f} s, over the {LESSON_BUDGET_SECONDS:.0f} s budget"
    )


def test_the_whole_book_runs_within_its_budget():
    """Every executed page together, lessons and exercise solutions, stays within six minutes on 2 cores."""
    executed = runtimes()
    lessons = sum(seconds for entry, seconds in executed.items() if entry.startswith("chapters/"))
    total = sum(executed.values())
    print(f"whole book: {total:.1f} s ({lessons:.1f} s of lessons, {total - lessons:.1f} s of exercise solutions)")
    assert total <= BOOK_BUDGET_SECONDS, (
        f"the book took {total:.1f} s to execute, over the {BOOK_BUDGET_SECONDS:.0f} s budget "
        f"({lessons:.1f} s of it in the lessons)"
    )


def test_chapter_02_has_widget_and_static_figure():
    content = main_content(page_for("chapters/02_hard_and_soft_attention"))
    assert content.find("script", attrs={"type": "application/vnd.jupyter.widget-view+json"}), "the β widget is missing"
    alts = [image.get("alt", "") for image in content.find_all("img")]
    assert any("beta" in alt and "heatmap" in alt for alt in alts), "the small-multiples β figure is missing"
    assert content.find(class_="math"), "no math on the page"
