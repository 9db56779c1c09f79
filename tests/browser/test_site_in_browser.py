"""The built book in a real browser (headless Chromium), as readers use it on a desktop and on a phone.

Pages are discovered from the build, so the tests check whichever pages exist. Every page is loaded once at the
desktop width and measured in one go (the ``desktop`` report below) for what depends on its content: errors,
accessibility, formulas, code blocks, images, bytes, and last, the controls of its interactive figures. The layout at phone width depends on the page's template (the
theme's CSS for a lesson, an exercise, a reference page...), so it is checked on one page of each template: the
one with the most display equations, the likeliest to be cut off (:data:`PHONE_PAGES`). Each test judges one aspect
of a report, so a page that fails one check still reports on the others.

No verdict depends on how fast the machine is: pages are loaded until the browser reports them loaded, their
formulas typeset, their fonts loaded and no request in flight, with no time limit but the hang guard of ``visit``
(see tests/browser/conftest.py). The desktop visit of a page also serves the checks of the controls it has (launch
and download menus, collapsed solutions and library source), worked after everything else was measured.

``make test`` runs these tests on two pytest-xdist workers: each page's tests (their ids end with the page, see
:func:`per_page`) are one unit of work (tests/conftest.py), so a page is loaded once per viewport, in the worker
whose tests judge it.
"""

from __future__ import annotations

import re

import pytest

from tests.book.site import HTML, html_pages, learner_notebook, require_site, soup
from tests.browser.conftest import SCREENSHOTS, run_axe

pytestmark = pytest.mark.browser
require_site()

DESKTOP, PHONE = (1366, 900), (390, 844)
FIRST_LOAD_BUDGET = 3_000_000  # bytes a page may fetch on its first load, everything included
MAX_OVERFLOWING_CODE_BLOCKS = 2  # per page, at desktop width
RETINA = 1.8  # a content image's natural width over its displayed width

PAGES = [page.relative_to(HTML).as_posix() for page in html_pages()]
LESSON = "chapters/02_hard_and_soft_attention.html"
INTERACTIVE_PAGES = [path for path in PAGES if soup(HTML / path).select("figure.ac-interactive")]
EXERCISE_PAGES = [path for path in PAGES if learner_notebook(path.removesuffix(".html"))]
SCREENSHOT_PAGES = [path for path in (LESSON, "chapters/05_scaling_and_masking.html", "index.html") if path in PAGES]
# Pages whose desktop visit also works a control after the content checks (see ``interact``): the launch and
# download buttons, and the first collapsed solution and the first collapsed library source of the book.
LAUNCH_PAGES = EXERCISE_PAGES + [LESSON] if LESSON in PAGES else EXERCISE_PAGES
SOLUTION_PAGE = EXERCISE_PAGES[0] if EXERCISE_PAGES else None
LIBRARY_SOURCE_PAGE = next((path for path in PAGES if soup(HTML / path).select("details.library-source")), None)


def per_page(paths: list[str]) -> list:
    """``paths`` as parameters whose test ids end with the page (``[chapters/x.html]``): under ``make test``
    (two pytest-xdist workers), tests/conftest.py makes each page's tests one unit of work, so that every test
    judging a page's reports runs in the worker that loaded it."""
    return [pytest.param(path, id=path) for path in paths]


def template(path: str) -> str:
    """The kind of page, which decides its layout: how the build made it and where it sits."""
    if path in ("index.html", "intro.html"):
        return "landing page"
    if path in ("genindex.html", "py-modindex.html", "search.html"):
        return "generated index or search"
    if path == "chapters/api.html":
        return "API reference"
    from_notebook = (HTML / "_sources" / path).with_suffix(".ipynb").exists()
    if path.startswith("exercises/"):
        return "exercise notebook" if from_notebook else "exercise page"
    return "lesson notebook" if from_notebook else "text page"


def _display_equations(path: str) -> int:
    return len(soup(HTML / path).select("div.math, .math-wrapper"))


# One page per template, the one with the most display equations (then the longest): the phone layout checks.
PHONE_PAGES = sorted({
    kind: max((p for p in PAGES if template(p) == kind),
              key=lambda p: (_display_equations(p), (HTML / p).stat().st_size, p))
    for kind in {template(p) for p in PAGES}
}.values())

# One evaluate() call measures everything the layout tests need.
MEASURE = """() => {
  const main = document.querySelector('main') || document.body;
  const text = el => (el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 70);
  const overflows = el => el.scrollWidth > el.clientWidth + 1;
  const code = Array.from(main.querySelectorAll('div.highlight pre, .cell_output pre, .output pre'))
    .filter(pre => pre.offsetParent !== null && overflows(pre))
    .map(pre => text(pre));
  const equations = Array.from(main.querySelectorAll('mjx-container[display="true"]'))
    .filter(eq => eq.offsetParent !== null)
    .map(eq => {
      const box = eq.getBoundingClientRect();
      const content = Array.from(eq.children).reduce((w, c) => Math.max(w, c.getBoundingClientRect().width), 0);
      const style = getComputedStyle(eq);
      // Clipped: content wider than its box and no way to scroll to the rest, or the box cut by the page edge.
      const scrolls = /(auto|scroll)/.test(style.overflowX);
      const tooWide = content > box.width + 1 || eq.scrollWidth > eq.clientWidth + 1;
      return {tex: (eq.parentElement.getAttribute('data-tex') || text(eq.parentElement)).slice(0, 70),
              tooWide, clipped: (tooWide && !scrolls) || box.right > window.innerWidth + 1,
              content: Math.round(content), box: Math.round(box.width)};
    });
  const images = Array.from(main.querySelectorAll('img'))
    .filter(img => !img.closest('.btn, .navbar, .bd-header, header') && !img.src.includes('/_static/'))
    .map(img => ({src: img.currentSrc.slice(-60), alt: img.alt, ok: img.complete && img.naturalWidth > 0,
                  natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
                  svg: /\\.svg($|\\?)/.test(img.currentSrc)}));
  return {title: document.title, pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
          code, equations, images,
          merrors: main.querySelectorAll('mjx-merror').length,
          tabbableMath: Array.from(main.querySelectorAll('mjx-container[tabindex]:not([tabindex="-1"])'))
            .filter(eq => eq.scrollWidth <= eq.clientWidth + 1).length};
}"""

_reports: dict[tuple[str, str], dict] = {}
VIEWPORTS = {"desktop": DESKTOP, "phone": PHONE, "dark": DESKTOP}


def report(visit, path: str, viewport: str) -> dict:
    """Load ``path`` in the named viewport (``desktop``, ``phone``, or ``dark``: desktop in dark mode) once per
    session and measure it (cached for the other tests); the screenshot pages are photographed on the way."""
    key = (path, viewport)
    if key not in _reports:
        width, height = VIEWPORTS[viewport]
        result = visit(path, width=width, height=height, dark=viewport == "dark")
        page = result.page  # loaded and settled: formulas typeset, fonts loaded, no request in flight
        measured = page.evaluate(MEASURE)
        measured["theme"] = page.evaluate("() => document.documentElement.dataset.theme")
        measured["bytes"] = result.bytes_loaded
        measured["largest"] = sorted(result.bytes_by_url.items(), key=lambda item: -item[1])[:4]
        measured["errors"] = {
            "uncaught JavaScript errors": result.page_errors,
            "console errors": result.console_errors,
            "failed requests": result.failed_responses,
            "requests to the network with no local copy": result.refused,
        }
        if viewport in ("desktop", "dark"):
            measured["axe"] = run_axe(page)
        if path in SCREENSHOT_PAGES:  # for people to look at (and for the README); the tests judge the report
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            name = f"{path.split('/')[-1].replace('.html', '')}-{viewport}"
            page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
            page.screenshot(path=str(SCREENSHOTS / f"{name}-top.png"))
            measured["screenshot"] = SCREENSHOTS / f"{name}.png"
        if viewport == "desktop":  # before any control is worked
            measured["collapsed"] = {selector: collapsed_state(page, selector)
                                     for selector, first_page in COLLAPSED.items() if path == first_page}
        if viewport == "desktop" and path in INTERACTIVE_PAGES:  # last: it changes what the page shows
            measured["controls"] = exercise_controls(page, path)
            measured["errors_after_controls"] = list(result.page_errors)
        # What the page reported up to here; the buttons worked below are judged by their own tests.
        measured["errors"] = {kind: list(found) for kind, found in measured["errors"].items()}
        if viewport == "desktop":
            measured.update(interact(page, path))
        _reports[key] = measured
    return _reports[key]


# A collapsed block the book shows closed, each checked on the first page that has one: its <details>, and what
# must be hidden until the reader opens it.
COLLAPSED = {"main details.hide": SOLUTION_PAGE, "main details.library-source": LIBRARY_SOURCE_PAGE}
COLLAPSED_CONTENT = {"main details.hide": ".highlight", "main details.library-source": ".highlight, pre"}
SHOWN_ON_CLICK = {"main details.hide": ".highlight", "main details.library-source": "pre"}


def collapsed_state(page, selector: str) -> dict:
    """How the first block ``selector`` looks before the reader touches it."""
    blocks = page.locator(selector)
    if not blocks.count():
        return {"count": 0}
    first = blocks.first
    return {"count": blocks.count(), "open": first.get_attribute("open"),
            "summary": first.locator("summary").inner_text(),
            "content_visible": first.locator(COLLAPSED_CONTENT[selector]).first.is_visible()}


def _attempt(action) -> str | None:
    """Run ``action``; None, or what went wrong (a report is cached, so a failure is recorded, not raised)."""
    try:
        action()
    except Exception as error:  # noqa: BLE001 - any failure of the page is the finding
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None


def interact(page, path: str) -> dict:
    """After every other check of the desktop visit: open the page's collapsed blocks (the pages of
    :data:`COLLAPSED`), then its launch menu and download menu (:data:`LAUNCH_PAGES`), recording what they show."""
    found: dict = {}
    for selector, first_page in COLLAPSED.items():
        if path == first_page and page.locator(selector).count():
            first = page.locator(selector).first

            def open_it(first=first, selector=selector):
                first.locator("summary").click()
                first.locator(SHOWN_ON_CLICK[selector]).first.wait_for(state="visible")

            found.setdefault("opened", {})[selector] = _attempt(open_it)
    if path in LAUNCH_PAGES:
        launch: dict = {}

        def open_launch_menu():
            page.locator(".dropdown-launch-buttons button").first.click()
            colab = page.locator(".dropdown-launch-buttons a[href*='colab.research.google.com']")
            colab.first.wait_for(state="visible")
            launch["colab"] = colab.first.get_attribute("href")
            page.keyboard.press("Escape")

        def download():
            page.locator(".dropdown-download-buttons button").first.click()
            link = page.locator(".dropdown-download-buttons a[href$='.ipynb']")
            link.first.wait_for(state="visible")
            response = page.request.get(link.first.evaluate("a => a.href"))
            body = response.body() if response.ok else b""
            launch.update(download_ok=response.ok, download_is_notebook=b'"cells"' in body,
                          download_has_solution=b"BEGIN SOLUTION" in body)

        launch["launch_problem"] = _attempt(open_launch_menu)
        if path in EXERCISE_PAGES:
            launch["download_problem"] = _attempt(download)
        found["launch"] = launch
    return found


@pytest.mark.parametrize("path", per_page(PAGES))
def test_page_loads_cleanly_with_maths_and_images(visit, path):
    measured = report(visit, path, "desktop")
    assert measured["title"], f"{path} has no title"
    assert measured["merrors"] == 0, f"{path}: MathJax reports a TeX error"
    for image in measured["images"]:
        assert image["ok"], f"{path}: image {image['src']} did not load"
        assert image["alt"].strip(), f"{path}: image {image['src']} has no alt text"
    problems = {kind: found for kind, found in measured["errors"].items() if found}
    assert not problems, f"{path}: {problems}"


@pytest.mark.parametrize("path", per_page(PAGES))
def test_no_serious_accessibility_violations(visit, path):
    """axe-core 4.14: no serious or critical violation (contrast, names of controls, landmarks, ARIA)."""
    violations = report(visit, path, "desktop")["axe"]
    described = [f"{v['impact']} {v['id']} ({v['help']}): {v['targets']}" for v in violations]
    assert not violations, f"{path}: axe-core finds\n" + "\n".join(described)


@pytest.mark.parametrize("path", per_page(SCREENSHOT_PAGES))
def test_no_serious_accessibility_violations_in_dark_mode(visit, path):
    measured = report(visit, path, "dark")
    assert measured["theme"] == "dark"
    violations = measured["axe"]
    described = [f"{v['impact']} {v['id']} ({v['help']}): {v['targets']}" for v in violations]
    assert not violations, f"{path} in dark mode: axe-core finds\n" + "\n".join(described)


@pytest.mark.parametrize("path", per_page(PAGES))
def test_formulas_are_out_of_the_tab_order(visit, path):
    """A keyboard reader tabs through links and controls, not through every formula (only through an equation
    too wide for the column, which scrolls and so must be reachable)."""
    focusable = report(visit, path, "desktop")["tabbableMath"]
    assert focusable == 0, f"{path}: {focusable} formulas are in the tab order"


@pytest.mark.parametrize("path", per_page(PAGES))
def test_code_blocks_fit_the_column(visit, path):
    overflowing = report(visit, path, "desktop")["code"]
    assert len(overflowing) <= MAX_OVERFLOWING_CODE_BLOCKS, (
        f"{path}: {len(overflowing)} code or output blocks scroll sideways at {DESKTOP[0]} px (at most "
        f"{MAX_OVERFLOWING_CODE_BLOCKS}); keep code lines within 88 characters. First ones: {overflowing[:5]}"
    )


@pytest.mark.parametrize("path", per_page(PAGES))
def test_equations_fit_on_a_desktop(visit, path):
    wide = [eq for eq in report(visit, path, "desktop")["equations"] if eq["tooWide"] or eq["clipped"]]
    assert not wide, (
        f"{path}: display equations wider than the column at {DESKTOP[0]} px (break them with aligned/split): "
        + "; ".join(f"{eq['tex']!r} ({eq['content']} px in {eq['box']} px)" for eq in wide)
    )


def test_every_template_has_a_phone_page():
    assert {template(path) for path in PHONE_PAGES} == {template(path) for path in PAGES}
    assert LESSON not in PAGES or any(template(path) == "lesson notebook" for path in PHONE_PAGES)


@pytest.mark.parametrize("path", per_page(PHONE_PAGES))
def test_equations_are_never_clipped_on_a_phone(visit, path):
    """Too wide for a phone is expected; cut off is not: an equation wider than the screen scrolls sideways."""
    clipped = [eq for eq in report(visit, path, "phone")["equations"] if eq["clipped"]]
    assert not clipped, f"{path}: display equations cut off at {PHONE[0]} px: {[eq['tex'] for eq in clipped]}"


@pytest.mark.parametrize("path", per_page(PHONE_PAGES))
def test_no_horizontal_page_overflow_on_a_phone(visit, path):
    measured = report(visit, path, "phone")
    assert measured["pageWidth"] <= measured["viewport"], (
        f"{path} is {measured['pageWidth']} px wide on a {measured['viewport']} px phone screen"
    )


@pytest.mark.parametrize("path", per_page(PAGES))
def test_content_images_are_sharp_on_high_resolution_screens(visit, path):
    blurry = [
        image
        for image in report(visit, path, "desktop")["images"]
        if image["ok"] and not image["svg"] and image["shown"] > 0 and image["natural"] < RETINA * image["shown"]
    ]
    assert not blurry, f"{path}: images drawn at less than 2x their displayed width: " + "; ".join(
        f"{image['src']} ({image['natural']} px shown at {image['shown']:.0f} px)" for image in blurry
    )


@pytest.mark.parametrize("path", per_page(PAGES))
def test_figures_are_not_shrunk_below_their_size(visit, path):
    """A figure laid out for the column (<= 7.5 in at 100 dpi) shows at its own size, so 8 pt text stays 8 pt;
    a wider one is scaled down to the column and its labels with it."""
    shrunk = [
        image
        for image in report(visit, path, "desktop")["images"]
        if image["ok"] and not image["svg"] and image["shown"] > 0 and image["shown"] < 0.9 * image["natural"] / 2
    ]
    assert not shrunk, f"{path}: figures shrunk to fit the column (make them narrower): " + "; ".join(
        f"{image['src']} ({image['natural'] / 2:.0f} px shown at {image['shown']:.0f} px)" for image in shrunk
    )


@pytest.mark.parametrize("path", per_page(PAGES))
def test_first_load_within_budget(visit, path):
    measured = report(visit, path, "desktop")
    print(f"{path}: {measured['bytes'] / 1e6:.2f} MB on first load")
    assert measured["bytes"] <= FIRST_LOAD_BUDGET, (
        f"{path} fetches {measured['bytes'] / 1e6:.2f} MB on first load, over the {FIRST_LOAD_BUDGET / 1e6:g} MB "
        f"budget; largest: {[(url[-60:], size) for url, size in measured['largest']]}"
    )


def exercise_controls(page, path: str) -> list[str]:
    """Work every control of every interactive figure from the keyboard, as a reader without a mouse would, and
    return what is wrong: each change must show another frame, with its own alt text."""
    problems: list[str] = []
    figures = page.locator("main figure.ac-interactive")
    if figures.count() != len(soup(HTML / path).select("figure.ac-interactive")):
        problems.append(f"{path}: {figures.count()} interactive figures in the browser, not as many as in the page")
    for number in range(figures.count()):
        figure = figures.nth(number)
        image = figure.locator("img.ac-frame")
        controls = figure.locator("[data-control]")
        if not controls.count():
            problems.append(f"{path}: interactive figure {number + 1} has no control")
        for index in range(controls.count()):
            control = controls.nth(index)
            name = control.get_attribute("data-control")
            label = figure.locator(f'label[for="{control.get_attribute("id")}"]')
            if not (label.count() == 1 and label.inner_text().strip()):
                problems.append(f"{path}: control {name} has no label")
            before = (image.get_attribute("src"), image.get_attribute("alt"))
            kind = control.evaluate("el => el.type")
            control.focus()
            if kind == "range":
                at_end = control.evaluate("el => el.value === el.max")
                page.keyboard.press("Home" if at_end else "End")
                text = control.get_attribute("aria-valuetext")
                labels = control.evaluate("el => JSON.parse(el.dataset.labels)")
                if text != labels[int(control.input_value())]:
                    problems.append(f"{path}: slider {name} announces {text!r}, not its value")
            elif kind == "checkbox":
                page.keyboard.press("Space")
            else:  # a select: the next option (or the first, from the last)
                options = control.locator("option").count()
                current = int(control.input_value())
                control.select_option(str((current + 1) % options))
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())
            after = (image.get_attribute("src"), image.get_attribute("alt"))
            if after[0] == before[0]:
                problems.append(f"{path}: moving {name} of figure {number + 1} does not change its image")
            if not (after[1] != before[1] and after[1].strip()):
                problems.append(f"{path}: moving {name} of figure {number + 1} leaves the alt text as it was")
    return problems


@pytest.mark.parametrize("path", per_page(INTERACTIVE_PAGES))
def test_every_control_of_every_interactive_figure_changes_its_image(visit, path):
    """Judged on the desktop visit of the page (after its other measurements): no dead control."""
    measured = report(visit, path, "desktop")
    assert not measured["controls"], "\n".join(measured["controls"])
    assert not measured["errors_after_controls"], f"{path}: JavaScript errors {measured['errors_after_controls']}"


@pytest.mark.parametrize("path", per_page(EXERCISE_PAGES))
def test_exercise_launch_and_download_open_the_learner_notebook(visit, path, repository_url):
    """Judged on the desktop visit of the page, after its other checks: the launch menu opens the learner
    notebook in Colab, the download menu serves a notebook, not the solution."""
    learner = learner_notebook(path.removesuffix(".html"))
    launch = report(visit, path, "desktop")["launch"]
    assert launch["launch_problem"] is None, f"{path}: the launch menu does not open: {launch['launch_problem']}"
    github_path = repository_url.removeprefix("https://github.com/")
    assert launch["colab"] == (
        f"https://colab.research.google.com/github/{github_path}/blob/main/{learner}.ipynb"
    )
    assert launch["download_problem"] is None, f"{path}: the download menu does not open: {launch['download_problem']}"
    assert launch["download_ok"] and launch["download_is_notebook"], "the download button does not serve a notebook"
    assert not launch["download_has_solution"], f"{path}: the download hands out the solution notebook"


@pytest.mark.parametrize("path", per_page([LESSON] if LESSON in PAGES else []))
def test_lesson_launch_button_opens_the_lesson(visit, path, repository_url):
    launch = report(visit, LESSON, "desktop")["launch"]
    assert launch["launch_problem"] is None, f"{LESSON}: the launch menu does not open: {launch['launch_problem']}"
    github_path = repository_url.removeprefix("https://github.com/")
    assert launch["colab"] == (
        f"https://colab.research.google.com/github/{github_path}/blob/main/{LESSON.replace('.html', '.ipynb')}"
    )


def test_search_ranks_the_lesson_first(visit):
    lessons = [path for path in PAGES if re.match(r"chapters/\d\d", path)]
    if not lessons:
        pytest.skip("no lesson in this build")
    result = visit("search.html?q=softmax")
    page = result.page
    page.wait_for_selector("#search-results li")
    page.wait_for_function(
        "() => !document.querySelector('#search-results .search-summary')?.textContent.includes('Searching')"
    )
    links = page.eval_on_selector_all("#search-results li a", "as => as.map(a => a.getAttribute('href'))")
    assert links, "searching for softmax finds nothing"
    assert re.match(r"(\.\./)?chapters/\d\d", links[0]), f"the first result for softmax is not a lesson: {links[:5]}"


@pytest.mark.parametrize("path", per_page([SOLUTION_PAGE] if SOLUTION_PAGE else []))
def test_solutions_start_collapsed_and_open_on_click(visit, path):
    measured = report(visit, path, "desktop")
    state = measured["collapsed"]["main details.hide"]
    assert state["count"] > 0, f"{path}: no collapsed solution"
    assert state["open"] is None, "the solution starts open"
    assert "Show solution" in state["summary"]
    assert not state["content_visible"], "solution code is visible before the reader opens it"
    problem = measured["opened"]["main details.hide"]
    assert problem is None, f"{path}: the solution does not open on click: {problem}"


@pytest.mark.parametrize("path", per_page([LIBRARY_SOURCE_PAGE] if LIBRARY_SOURCE_PAGE else []))
def test_library_source_starts_collapsed(visit, path):
    measured = report(visit, LIBRARY_SOURCE_PAGE, "desktop")
    state = measured["collapsed"]["main details.library-source"]
    assert state["count"] > 0, f"{LIBRARY_SOURCE_PAGE}: its library source is not in the browser's page"
    assert state["open"] is None
    assert not state["content_visible"]
    problem = measured["opened"]["main details.library-source"]
    assert problem is None, f"{LIBRARY_SOURCE_PAGE}: the library source does not open on click: {problem}"


@pytest.mark.parametrize("path", per_page(SCREENSHOT_PAGES))
@pytest.mark.parametrize("mode", ["desktop", "phone", "dark"])
def test_screenshot(visit, path, mode):
    """Screenshots for people to look at (and for the README), taken while the page is measured."""
    assert report(visit, path, mode)["screenshot"].stat().st_size > 10_000
