"""Serve the built book on 127.0.0.1 and drive it with Debian's Chromium through Playwright.

The book loads MathJax and RequireJS from CDNs. CI has no internet, so the test browser gets them from local npm
copies (tests/browser/package.json) through Playwright request routing; any other request that leaves 127.0.0.1 is
refused and recorded, so a page that depends on the network is caught. Every response's size is recorded too (the
first-load budget), and axe-core (also from npm) is injected to check accessibility.

Which site: the one ``COURSE_SITE`` names (see tests/book/site.py); a bare ``pytest`` skips these tests.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.book.site import HTML, require_site

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NODE_MODULES = HERE / "node_modules"
AXE = NODE_MODULES / "axe-core" / "axe.min.js"
SCREENSHOTS = HTML.parent / "screenshots"

# How long any browser wait may last before the test fails as hung: far beyond what a page needs on the
# busiest machine, so that no verdict depends on the machine's speed (see the visit fixture).
HANG_GUARD_MS = 600_000

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# CDN URL prefix -> folder under node_modules that holds the same files.
CDN_FILES = {
    "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.4/require.min.js": NODE_MODULES / "requirejs" / "require.js",
}
CDN_PACKAGE = re.compile(r"^https://(?:cdn\.jsdelivr\.net/npm|unpkg\.com)/(@[^/@]+/[^/@]+|[^/@]+)@[^/]+/(.*)$")
# Subresource-integrity hashes name the CDN's exact bytes (e.g. the minified require.min.js); the npm copies
# differ byte for byte, so pages served to the test browser drop `integrity` on the scripts it serves locally.
SCRIPT_TAG = re.compile(r"<script\b[^>]*>")
SCRIPT_SRC = re.compile(r'\ssrc="(https://[^"]+)"')
INTEGRITY = re.compile(r'\s+integrity="[^"]*"')


def drop_integrity_of_local_scripts(html: str) -> str:
    def rewrite(tag: re.Match) -> str:
        source = SCRIPT_SRC.search(tag.group(0))
        if source and local_copy(source.group(1)):
            return INTEGRITY.sub("", tag.group(0))
        return tag.group(0)

    return SCRIPT_TAG.sub(rewrite, html)


# Known upstream defects that do not affect readers, each with its reason. Anything else fails the tests.
KNOWN_PAGE_ERRORS = {
    # sphinx-thebe 0.3.1 adds its configuration script twice under Jupyter Book 1.0.4; thebe is not enabled in
    # this book, so the second declaration is never used.
    "Identifier 'THEBE_JS_URL' has already been declared",
    # @jupyter-widgets/html-manager 1.0.6 (the version MyST-NB loads) typesets widget labels through the
    # MathJax 2 API (MathJax.Hub.Queue); the book uses MathJax 3. The widget itself has rendered by then.
    "Cannot read properties of undefined (reading 'Queue')",
}
# The widget manager's stylesheet names its icon fonts by a path relative to the page, where no site has them.
KNOWN_MISSING = re.compile(r"/@jupyter-widgets/html-manager/dist/[0-9a-f]{20}\.(woff2?|ttf|eot|svg)$")
CONTENT_TYPES = {".js": "application/javascript", ".css": "text/css", ".woff": "font/woff", ".woff2": "font/woff2"}


def chromium_path() -> str:
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    found = shutil.which("chromium")
    if found:
        return found
    pytest.fail(
        "Debian's chromium is not installed; `make test` installs it (apt-get install chromium) when run as root",
        pytrace=False,
    )


def local_copy(url: str) -> Path | None:
    """The local file that stands in for a CDN URL, or None when there is none."""
    url = url.split("?", 1)[0]
    if url in CDN_FILES:
        return CDN_FILES[url]
    match = CDN_PACKAGE.match(url)
    if match:
        package, path = match.groups()
        candidate = NODE_MODULES / package / path
        if candidate.is_file():
            return candidate
    return None


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the standard library's name
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``folder`` on 127.0.0.1 (any free port) from a daemon thread: the server and its URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def route_locally(route, refused: list[str] | None = None) -> None:
    """Playwright route handler: pages from the local server (without integrity hashes on the scripts served
    from npm copies), CDN files from the npm copies; anything else is refused (and its URL added to
    ``refused``), since nothing outside this machine is reachable."""
    url = route.request.url
    if urlsplit(url).hostname == "127.0.0.1":
        if route.request.resource_type != "document":
            return route.continue_()
        response = route.fetch()
        return route.fulfill(response=response, body=drop_integrity_of_local_scripts(response.text()))
    copy = local_copy(url)
    if copy is None:
        if refused is not None:
            refused.append(url)
        return route.abort()
    # The book loads these scripts with crossorigin="anonymous", so the response must allow CORS.
    headers = {"Content-Type": CONTENT_TYPES.get(copy.suffix, "application/octet-stream"),
               "Access-Control-Allow-Origin": "*"}
    return route.fulfill(path=str(copy), headers=headers)


@pytest.fixture(scope="session")
def site_url():
    require_site()
    if not AXE.exists() or not (NODE_MODULES / "mathjax").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=HERE, check=True)
    server, url = serve(HTML)
    yield url
    server.shutdown()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


class PageVisit:
    """A page with everything it reported: console errors, uncaught exceptions, refused requests."""

    def __init__(self, page):
        self.page = page
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        self.refused: list[str] = []
        self.failed_responses: list[str] = []
        self.bytes_by_url: dict[str, int] = {}
        self.in_flight: set = set()  # requests sent and not yet finished or failed

    @property
    def bytes_loaded(self) -> int:
        """Bytes sent over the network for every response so far (documents, scripts, styles, fonts, images)."""
        return sum(self.bytes_by_url.values())


# Web servers and CDNs (GitHub Pages, jsDelivr) send text compressed; the test server does not, so the size a reader
# downloads is estimated as the gzip size of text responses and the raw size of everything else (images, fonts).
COMPRESSED_TYPES = re.compile(r"(text/|javascript|json|xml|svg)")


def transfer_size(body: bytes, content_type: str) -> int:
    if COMPRESSED_TYPES.search(content_type or ""):
        return len(gzip.compress(body, compresslevel=6))
    return len(body)


@pytest.fixture
def visit(browser, site_url):
    contexts = []

    def open_page(path: str, width: int = 1366, height: int = 900, dark: bool = False) -> PageVisit:
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="dark" if dark else "light")
        # Every wait (loading, typesetting, a frame appearing) lasts until what is awaited happens: a test judges
        # whether it happens, never how fast on a machine that may be busy. HANG_GUARD_MS only ends a hang.
        context.set_default_timeout(HANG_GUARD_MS)
        context.set_default_navigation_timeout(HANG_GUARD_MS)
        if dark:  # the theme keeps the reader's choice in localStorage
            context.add_init_script("localStorage.setItem('mode', 'dark'); localStorage.setItem('theme', 'dark');")
        contexts.append(context)
        page = context.new_page()
        result = PageVisit(page)

        page.route("**/*", functools.partial(route_locally, refused=result.refused))

        def on_console(message):
            # A failed request is reported (with its URL) by the response handler below.
            if message.type == "error" and not message.text.startswith("Failed to load resource"):
                result.console_errors.append(message.text)

        def on_response(response):
            if response.status >= 400 and not KNOWN_MISSING.search(response.url):
                result.failed_responses.append(f"{response.status} {response.url}")

        def on_finished(request):
            response = request.response()
            if response is None:
                return
            try:
                body = response.body()
                result.bytes_by_url[request.url] = transfer_size(body, response.headers.get("content-type", ""))
            except Exception:  # a redirect or a response the browser has already dropped has no body to read
                pass

        page.on("console", on_console)
        page.on("response", on_response)
        page.on("requestfinished", on_finished)
        page.on(
            "pageerror",
            lambda error: str(error) in KNOWN_PAGE_ERRORS or result.page_errors.append(str(error)),
        )
        # (functions, not the set's builtin methods: Playwright reads a handler's signature)
        page.on("request", lambda request: result.in_flight.add(request))
        page.on("requestfinished", lambda request: result.in_flight.discard(request))
        page.on("requestfailed", lambda request: result.in_flight.discard(request))
        page.goto(f"{site_url}/{path}", wait_until="load")
        target = refresh_target(path)
        if target:  # a redirecting page (the site's index.html): the page a reader ends up on
            page.wait_for_url(f"{site_url}/{target}", wait_until="load")
        settle(page, result)
        return result

    yield open_page
    for context in contexts:
        context.close()


REFRESH = re.compile(r'<meta http-equiv="refresh" content="\d+;\s*url=([^"]+)"', re.IGNORECASE)


def refresh_target(path: str) -> str | None:
    """The page that ``path`` (relative to the site) redirects to with a <meta> refresh, or None."""
    file = HTML / path.split("?", 1)[0]
    found = REFRESH.search(file.read_text(encoding="utf-8", errors="replace")[:2000]) if file.is_file() else None
    return (Path(path).parent / found.group(1).strip()).as_posix().removeprefix("./") if found else None


def settle(page, result: PageVisit) -> None:
    """Wait, after the load event, until the page has done what it does on its own: MathJax has typeset every
    formula, the fonts in use have loaded, and no request is in flight. These are the conditions themselves
    (not a quiet period, like Playwright's "networkidle"), each awaited however long it takes, up to the hang
    guard; a hang fails with the requests still in flight."""
    wait_for_maths(page)
    page.evaluate("() => document.fonts.ready.then(() => true)")
    deadline = time.monotonic() + HANG_GUARD_MS / 1000
    while result.in_flight:
        if time.monotonic() > deadline:
            pytest.fail(f"requests still in flight after {HANG_GUARD_MS / 1000:.0f} s: "
                        f"{sorted(request.url for request in result.in_flight)}", pytrace=False)
        page.wait_for_timeout(20)  # lets Playwright deliver the pending requests' events


def run_axe(page) -> list[dict]:
    """axe-core's serious and critical violations on the page: ``[{id, impact, help, targets}]``."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    return page.evaluate(
        """async () => {
            const results = await axe.run(document, {resultTypes: ['violations']});
            return results.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => ({id: v.id, impact: v.impact, help: v.help,
                            targets: v.nodes.slice(0, 6).map(n => n.target.join(' ') + ' :: '
                                + (n.failureSummary || '').split('\\n').slice(1, 2).join(''))}));
        }"""
    )


def wait_for_maths(page) -> None:
    """Wait until MathJax has typeset every formula of the main content (if it has any), however long that takes
    (up to the context's hang guard)."""
    if page.locator("main .math").count():
        page.wait_for_function(
            "() => document.querySelectorAll('main .math').length"
            " === document.querySelectorAll('main .math mjx-container').length"
        )
