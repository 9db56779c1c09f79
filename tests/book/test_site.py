"""The built book (`make book` output in _build/html), checked offline: pages, links, images, runtimes."""

from __future__ import annotations

import re

import pytest

from tests.book.site import (
    BOOK_BUDGET_SECONDS,
    HTML,
    LESSON_BUDGET_SECONDS,
    anchors_in,
    cpu_times,
    html_pages,
    internal_links,
    learner_notebook,
    main_content,
    notebook_entries,
    page_for,
    require_site,
    runtimes,
    soup,
    toc_entries,
)

pytestmark = pytest.mark.book

require_site()


@pytest.mark.parametrize("entry", toc_entries())
def test_every_toc_entry_is_built(entry):
    assert page_for(entry).exists(), f"{entry} is in _toc.yml but {page_for(entry)} was not built"


@pytest.mark.parametrize("entry", notebook_entries())
def test_colab_button_opens_this_notebook_on_main(entry, repository_url):
    """Lessons open themselves; exercise pages (which show the solutions) open the learner notebook."""
    github_path = repository_url.removeprefix("https://github.com/")
    notebook = learner_notebook(entry) or entry
    expected = f"https://colab.research.google.com/github/{github_path}/blob/main/{notebook}.ipynb"
    links = [
        a["href"] for a in soup(page_for(entry)).find_all("a", href=True) if "colab.research.google.com" in a["href"]
    ]
    assert links == [expected], f"{entry}: Colab links {links}, expected exactly {expected}"


@pytest.mark.parametrize("entry", notebook_entries())
def test_download_button_offers_the_notebook(entry):
    notebook = learner_notebook(entry) or entry
    hrefs = [a["href"] for a in soup(page_for(entry)).find_all("a", href=True)]
    downloads = [href for href in hrefs if href.endswith(".ipynb") and "_sources" in href]
    assert downloads, f"{entry}: no download link to an .ipynb source"
    for href in downloads:
        target = (page_for(entry).parent / href).resolve()
        assert target == (HTML / "_sources" / f"{notebook}.ipynb").resolve(), (
            f"{entry}: the download link {href} does not offer {notebook}.ipynb"
        )
        assert target.exists(), f"{entry}: the download link {href} points at a missing file"
        if notebook != entry:
            text = target.read_text()
            assert "### BEGIN SOLUTION" not in text, f"{entry}: the downloaded learner notebook holds the solution"


@pytest.mark.parametrize("entry", [e for e in notebook_entries() if learner_notebook(e)])
def test_exercise_pages_hide_markers_and_label_solutions(entry):
    content = main_content(page_for(entry))
    text = content.get_text()
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text, f"{entry}: solution markers are shown"
    summaries = [summary.get_text(" ", strip=True) for summary in content.select("details.hide > summary")]
    assert any("Show solution" in summary for summary in summaries), f"{entry}: no 'Show solution' toggle"
    assert not any("Show code cell source" in summary for summary in summaries), (
        f"{entry}: a solution toggle still says 'Show code cell source'"
    )


def image_problem(image) -> str | None:
    """Why an <img> fails readers of screen readers, or None: it needs alt text in words, or must be marked
    decorative (``alt=""`` with ``role="presentation"``/``"none"`` or ``aria-hidden="true"``)."""
    alt = image.get("alt")
    if alt is not None and not alt.strip():
        decorative = image.get("role") in ("presentation", "none") or image.get("aria-hidden") == "true"
        return None if decorative else 'alt="" without role="presentation" or aria-hidden="true"'
    if alt is None:
        return "no alt attribute"
    if not re.search(r"[^\W\d_]{2}", alt):
        return f"alt text {alt!r} has no word"
    if re.fullmatch(r"(_build/)?[\w/.-]+\.(png|svg|jpg|jpeg|gif)", alt.strip()):
        return f"alt text {alt!r} is a file name"
    return None


def test_image_checks_tell_alt_text_from_none():
    from bs4 import BeautifulSoup

    def problem(html: str) -> str | None:
        return image_problem(BeautifulSoup(html, "html.parser").img)

    assert problem('<img src="a.png" alt="Attention weights of head 2 as a heatmap">') is None
    assert problem('<img src="a.png" alt="" role="presentation">') is None
    assert problem('<img src="a.png" alt="" aria-hidden="true">') is None
    assert problem('<img src="a.png">') == "no alt attribute"
    assert "role" in problem('<img src="a.png" alt="">')
    assert "no word" in problem('<img src="_static/minus.png" class="toggler" alt="-">')
    assert "file name" in problem('<img src="a.png" alt="_build/figure_3.png">')


@pytest.mark.parametrize("page", html_pages(), ids=lambda p: p.relative_to(HTML).as_posix())
def test_every_image_has_alt_text(page):
    """Every <img> of the whole page (header, sidebars, generated index pages included)."""
    problems = [f"{image.get('src')}: {image_problem(image)}" for image in soup(page).find_all("img") if image_problem(image)]
    assert not problems, f"{page.relative_to(HTML)}: images without alt text: {problems}"


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


def test_runtime_tables_list_every_notebook():
    executed, measured = runtimes(), cpu_times()
    for entry in notebook_entries():
        assert entry in executed, f"{entry} is missing from the execution table"
        assert entry in measured, f"{entry} is missing from the kernel CPU times (cpu-times.json)"
    table = main_content(page_for("chapters/runtimes")).find("table", id="kernel-cpu-times")
    assert table is not None, "the Runtimes page does not show the kernel CPU times"
    # each page's row shows what the budgets judge: its kernel CPU in the reference machine's seconds
    header = [cell.get_text(strip=True) for cell in table.find("thead").find_all("th")]
    assert header == ["Page", "CPU (s)", "Reference (s)", "Wall (s)"], header
    shown = {
        cells[0]: float(cells[2])
        for row in table.find("tbody").find_all("tr")
        if (cells := [cell.get_text(strip=True) for cell in row.find_all("td")])[0] != "Total"
    }
    for entry in notebook_entries():
        assert abs(shown[entry] - measured[entry]["reference_cpu_s"]) < 0.051, (entry, shown[entry], measured[entry])


# The whole book was over its 660 s budget from 2026-11-26 (695-732 s in fresh builds, a fresh kernel per notebook,
# each importing PyTorch); since each worker forks its kernels from a process that imported PyTorch once
# (_ext/kernel_zygote.py, 2026-11-27), fresh builds take 539 s and 587 s, and the check fails the build again.
# On 2026-11-29 nearly the same notebooks took 518 s here in the morning, 829 s in the afternoon and 807 s on
# CI: the kernel CPU grew with the host's load, so the budgets are judged in the reference machine's seconds.


@pytest.mark.parametrize("entry", notebook_entries())
def test_each_notebook_runs_within_its_budget(entry):
    """Judged on the kernel's CPU time in the reference machine's seconds (_ext/cpu_calibration.py), which
    neither a busy machine nor a slower one changes; the measured CPU and wall times are reported."""
    timing = cpu_times()[entry]
    print(
        f"{entry}: {timing['reference_cpu_s']:.1f} s on the reference machine ({timing['cpu_s']:.1f} s kernel "
        f"CPU here, calibration {timing['calibration_cpu_s']:.3f} s), {timing['wall_s']:.1f} s wall"
    )
    assert timing["reference_cpu_s"] <= LESSON_BUDGET_SECONDS, (
        f"{entry} took {timing['reference_cpu_s']:.1f} s of the reference machine's CPU time "
        f"({timing['cpu_s']:.1f} s of kernel CPU here, {timing['wall_s']:.1f} s wall), over the "
        f"{LESSON_BUDGET_SECONDS:.0f} s budget"
    )


def test_the_whole_book_runs_within_its_budget():
    """Every executed page together, lessons and exercise solutions, stays within eleven minutes of CPU time
    on the reference machine."""
    measured = cpu_times()
    lessons = sum(t["reference_cpu_s"] for entry, t in measured.items() if entry.startswith("chapters/"))
    total = sum(t["reference_cpu_s"] for t in measured.values())
    here = sum(t["cpu_s"] for t in measured.values())
    wall = sum(t["wall_s"] for t in measured.values())
    print(
        f"whole book: {total:.1f} s on the reference machine ({lessons:.1f} s of lessons, {total - lessons:.1f} s "
        f"of exercise solutions); {here:.1f} s kernel CPU here; {wall:.1f} s wall"
    )
    assert total <= BOOK_BUDGET_SECONDS, (
        f"the book took {total:.1f} s of the reference machine's CPU time to execute ({here:.1f} s of kernel CPU "
        f"here), over the {BOOK_BUDGET_SECONDS:.0f} s budget ({lessons:.1f} s of it in the lessons)"
    )


def test_chapter_02_has_interactive_and_static_figure():
    content = main_content(page_for("chapters/02_hard_and_soft_attention"))
    figure = content.find("figure", class_="ac-interactive")
    assert figure is not None, "the β interactive figure is missing"
    assert figure.find("input", attrs={"type": "range"}), "the β figure has no slider"
    alts = [image.get("alt", "") for image in content.find_all("img")]
    assert any("beta" in alt and "heatmap" in alt for alt in alts), "the small-multiples β figure is missing"
    assert content.find(class_="math"), "no math on the page"


@pytest.mark.parametrize("page", html_pages(), ids=lambda p: p.relative_to(HTML).as_posix())
def test_no_widget_state_or_widget_manager(page):
    """Interactive figures are native HTML on the site: no Jupyter widget state and no 4 MB widget manager."""
    document = soup(page)
    assert not document.find("script", attrs={"type": "application/vnd.jupyter.widget-view+json"}), (
        f"{page.relative_to(HTML)} holds a Jupyter widget (the course_site extension removes them): use "
        "ac.interactive_figure"
    )
    sources = [script.get("src", "") for script in document.find_all("script")]
    assert not [s for s in sources if "html-manager" in s or "embed-amd" in s], (
        f"{page.relative_to(HTML)} loads the Jupyter widget manager"
    )


def bibliography_labels() -> dict[str, str]:
    """``{anchor id: label}`` of the bibliography page, e.g. ``{"id16": "Vaswani et al., 2017"}``."""
    page = main_content(page_for("chapters/bibliography"))
    return {
        entry["id"]: entry.find(class_="label").get_text("", strip=True).strip("[]")
        for entry in page.select("div.citation[id]")
    }


def test_bibliography_labels_are_author_year():
    labels = bibliography_labels()
    assert labels, "the bibliography lists no entries"
    odd = [label for label in labels.values() if not re.fullmatch(r".+, (\d{4}[a-z]?|n\.d\.)", label)]
    assert not odd, f"bibliography labels that are not 'Author(s), year': {odd}"


@pytest.mark.parametrize("entry", [e for e in toc_entries() if re.match(r"chapters/\d\d", e)])
def test_citations_read_like_the_bibliography_labels(entry):
    """A citation "Vaswani et al. (2017)" links to the entry labelled "Vaswani et al., 2017"."""
    labels = bibliography_labels()
    for citation in main_content(page_for(entry)).select("span.bibtex-citation"):
        for link in citation.find_all("a", href=True):
            target = link["href"].split("#")[-1]
            if target not in labels:
                continue
            authors, year = labels[target].rsplit(", ", 1)
            text = citation.get_text(" ", strip=True)
            # Works whose short forms coincide (Chen et al., 2023 twice) are labelled 2023a and 2023b in the
            # bibliography, while the citation shows the year: it must still be that year.
            year = re.sub(r"(?<=\d)[a-z]$", "", year)
            assert link.get_text(" ", strip=True).endswith(year), f"{entry}: citation {text!r} links to {labels[target]!r}"
            assert authors.split(" et al.")[0] in text, f"{entry}: citation {text!r} links to {labels[target]!r}"
