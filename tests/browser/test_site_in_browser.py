"""The built book in a real browser (headless Chromium): pages, maths, images, buttons, widgets, search."""

from __future__ import annotations

import pytest

from tests.book.site import HTML, soup, toc_entries
from tests.browser.conftest import SCREENSHOTS

pytestmark = pytest.mark.browser

PAGES = [f"{entry}.html" for entry in toc_entries()] + ["search.html", "genindex.html"]
LESSON = "chapters/02_hard_and_soft_attention.html"
WIDGET_VIEW = 'script[type="application/vnd.jupyter.widget-view+json"]'
# Without a build the list is empty; the site_url fixture then fails every other test with the reason.
WIDGET_PAGES = [path for path in PAGES if (HTML / path).exists() and soup(HTML / path).select(WIDGET_VIEW)]
# Widget callbacks draw through ac.show_figure with alt text of this form, naming the static figure beside them.
SNAPSHOT_PREFIX = "The static figure beside it shows: "


def assert_clean(visit_result, path):
    assert not visit_result.page_errors, f"{path}: uncaught JavaScript errors {visit_result.page_errors}"
    assert not visit_result.console_errors, f"{path}: console errors {visit_result.console_errors}"
    assert not visit_result.failed_responses, f"{path}: failed requests {visit_result.failed_responses}"
    assert not visit_result.refused, f"{path}: requests to the network with no local copy {visit_result.refused}"


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_cleanly_with_maths_and_images(visit, path):
    result = visit(path)
    page = result.page
    assert page.title(), f"{path} has no title"
    if page.locator("main .math").count():
        page.wait_for_selector("main mjx-container", state="attached", timeout=20_000)
        assert page.locator("mjx-merror").count() == 0, f"{path}: MathJax reports a TeX error"
        assert page.locator("main .math mjx-container").count() == page.locator("main .math").count(), (
            f"{path}: not every formula was typeset"
        )
    images = page.eval_on_selector_all(
        "main img",
        "imgs => imgs.map(i => ({src: i.src.slice(0, 80), alt: i.alt, ok: i.complete && i.naturalWidth > 0,"
        " widget: i.closest('.jupyter-widgets') !== null}))",
    )
    for image in images:
        assert image["ok"], f"{path}: image {image['src']} did not load"
        where = "a widget's saved output (draw it with ac.show_figure)" if image["widget"] else "the page"
        assert image["alt"].strip(), f"{path}: image {image['src']} in {where} has no alt text"
    assert_clean(result, path)


def test_lesson_has_working_launch_and_download_buttons(visit, repository_url):
    result = visit(LESSON)
    page = result.page
    page.locator(".dropdown-launch-buttons button").first.click()
    colab = page.locator(".dropdown-launch-buttons a[href*='colab.research.google.com']")
    colab.first.wait_for(state="visible")
    github_path = repository_url.removeprefix("https://github.com/")
    expected = (
        f"https://colab.research.google.com/github/{github_path}/blob/main/chapters/02_hard_and_soft_attention.ipynb"
    )
    assert colab.first.get_attribute("href") == expected
    page.keyboard.press("Escape")
    page.locator(".dropdown-download-buttons button").first.click()
    download = page.locator(".dropdown-download-buttons a[href$='.ipynb']")
    download.first.wait_for(state="visible")
    response = page.request.get(download.first.evaluate("a => a.href"))
    assert response.ok and b'"cells"' in response.body(), "the download button does not serve the notebook"


def test_widget_renders_next_to_its_static_figure(visit):
    result = visit(LESSON)
    page = result.page
    page.wait_for_selector(".widget-slider, .jupyter-widgets.widget-hslider, .widget-hslider", timeout=20_000)
    assert page.locator("text=beta").count() > 0
    assert page.locator("main img[alt*='heatmaps']").count() >= 1, "the static small-multiples figure is missing"
    assert_clean(result, LESSON)


@pytest.mark.parametrize("path", WIDGET_PAGES)
def test_every_widget_renders_with_a_control_and_a_described_snapshot(visit, path):
    """Each saved widget is drawn by the widget manager; each interactive figure has a control, a loaded
    snapshot image with alt text and, on the page outside any widget, the static figure its alt text names."""
    result = visit(path)
    page = result.page
    page.wait_for_function(
        f"""() => Array.from(document.querySelectorAll('{WIDGET_VIEW}'))
                .every(view => view.parentElement.querySelector('.jupyter-widgets') !== null)""",
        timeout=20_000,
    )
    interactive = page.eval_on_selector_all(
        "main .widget-interact",
        """boxes => boxes.map(box => ({
            controls: box.querySelectorAll('.widget-slider, .widget-dropdown, .widget-toggle-buttons, '
                                           + '.widget-checkbox, .widget-select, .widget-radio-box').length,
            images: Array.from(box.querySelectorAll('img')).map(i => ({
                alt: i.alt, ok: i.complete && i.naturalWidth > 0})),
        }))""",
    )
    assert interactive, f"{path}: the saved widgets hold no interactive figure"
    static_alts = set(page.eval_on_selector_all(
        "main img", "imgs => imgs.filter(i => i.closest('.jupyter-widgets') === null).map(i => i.alt)"))
    for number, widget in enumerate(interactive, start=1):
        assert widget["controls"], f"{path}: interactive figure {number} has no control"
        assert widget["images"], f"{path}: interactive figure {number} shows no snapshot"
        for image in widget["images"]:
            assert image["ok"], f"{path}: the snapshot of interactive figure {number} did not load"
            assert image["alt"].strip(), f"{path}: the snapshot of interactive figure {number} has no alt text"
            if path == LESSON:
                continue  # its snapshot names its own beta; test_widget_renders_next_to_its_static_figure covers it
            assert SNAPSHOT_PREFIX in image["alt"], (
                f"{path}: the alt text of interactive figure {number} does not name its static figure"
            )
            named = image["alt"].split(SNAPSHOT_PREFIX, 1)[1]
            assert named in static_alts, (
                f"{path}: interactive figure {number} names a static figure that is not on the page: {named[:80]}"
            )
    assert_clean(result, path)


def test_search_finds_a_term_from_a_lesson(visit):
    result = visit("search.html?q=permutation+equivariant")
    page = result.page
    page.wait_for_selector("#search-results li, .search li", timeout=20_000)
    links = page.eval_on_selector_all("#search-results li a, .search li a", "as => as.map(a => a.href)")
    assert any("02_hard_and_soft_attention" in link for link in links), links


def test_solutions_start_collapsed_and_open_on_click(visit):
    solution_pages = sorted((HTML / "exercises" / "solutions").glob("ex*.html"))
    assert solution_pages, "no solution pages were built"
    path = solution_pages[0].relative_to(HTML).as_posix()
    result = visit(path)
    page = result.page
    hidden = page.locator("main details.hide")
    assert hidden.count() > 0, f"{path}: no collapsed solution"
    first = hidden.first
    assert first.get_attribute("open") is None, "the solution starts open"
    code = first.locator(".highlight").first
    assert not code.is_visible(), "solution code is visible before the reader opens it"
    first.locator("summary").click()
    code.wait_for(state="visible")
    assert_clean(result, path)


@pytest.mark.parametrize("path", [LESSON, "chapters/05_scaling_and_masking.html"])
def test_screenshot_of_lesson(visit, path):
    """Screenshots for people to look at (and for the README); the checks above judge the page."""
    result = visit(path, width=1280, height=1000)
    page = result.page
    if page.locator("main .math").count():
        page.wait_for_selector("main mjx-container", state="attached", timeout=20_000)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    name = path.split("/")[-1].replace(".html", "")
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}-top.png"))
    assert (SCREENSHOTS / f"{name}.png").stat().st_size > 10_000
