"""Regenerate the README's picture of the website from the built book: ``make screenshot``.

    python -m tests.browser.screenshot                       # chapter 02 into _static/site-screenshot.png
    python -m tests.browser.screenshot --page chapters/13_decoder_only_language_models.html --out /tmp/13.png

The page is served from ``_build/html`` (or ``COURSE_SITE``) on 127.0.0.1 and opened in Debian's Chromium
through Playwright, with the CDN assets (MathJax, RequireJS) from the local npm copies, exactly as the
browser tests do (tests/browser/conftest.py). Once the maths is typeset, the window is made tall enough to
show the whole table of contents down to its last part named in ``--show-part`` (by default the last
part of lessons in ``_toc.yml``), so the picture shows every part of the course; the script fails if the
part is not in the picture.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from tests.book.site import BOOK, HTML
from tests.browser.conftest import CHROMIUM_FLAGS, chromium_path, route_locally, serve, wait_for_maths

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PAGE = "chapters/02_hard_and_soft_attention.html"
DEFAULT_OUT = ROOT / "_static" / "site-screenshot.png"


def last_lesson_part() -> str:
    """The caption of the last part of ``_toc.yml`` that holds lessons (``chapters/NN_...``)."""
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    parts = [
        part["caption"]
        for part in toc["parts"]
        if any(chapter["file"].split("/")[-1][:2].isdigit() for chapter in part["chapters"])
    ]
    return parts[-1]


# Where, in page pixels, the sidebar's caption of the named part ends (null when the sidebar has no such part).
PART_BOTTOM = """(caption) => {
  const found = Array.from(document.querySelectorAll('.bd-sidebar-primary p.caption, .bd-sidebar-primary .caption'))
    .find(el => el.textContent.trim() === caption);
  if (!found) return null;
  const list = found.nextElementSibling;
  const bottom = (list || found).getBoundingClientRect().bottom;
  return Math.ceil(bottom + window.scrollY);
}"""


def take(page_path: str, out: Path, width: int, height: int, show_part: str) -> Path:
    from playwright.sync_api import sync_playwright

    if not (HTML / page_path).exists():
        raise SystemExit(f"{HTML / page_path} does not exist: run `make book` first")
    server, url = serve(HTML)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS, headless=True)
            context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="light")
            page = context.new_page()
            page.route("**/*", route_locally)
            page.goto(f"{url}/{page_path}", wait_until="load")
            page.wait_for_load_state("networkidle")
            wait_for_maths(page)
            bottom = page.evaluate(PART_BOTTOM, show_part)
            if bottom is None:
                raise SystemExit(f"the sidebar of {page_path} has no part {show_part!r}")
            if bottom + 16 > height:  # the whole table of contents, down to that part's last lesson
                page.set_viewport_size({"width": width, "height": bottom + 16})
                page.wait_for_load_state("networkidle")
            shown = page.evaluate(PART_BOTTOM, show_part)
            if shown is None or shown > page.viewport_size["height"]:
                raise SystemExit(f"the part {show_part!r} does not fit in the picture")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out))
            size = page.viewport_size
            browser.close()
    finally:
        server.shutdown()
    print(f"wrote {out} ({size['width']}x{size['height']}, {page_path}, down to {show_part!r})", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", default=DEFAULT_PAGE, help=f"page of the built site (default: {DEFAULT_PAGE})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the PNG")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1000, help="the least height; grows to show --show-part")
    parser.add_argument("--show-part", default=None, help="sidebar part that must be in the picture")
    args = parser.parse_args(argv)
    take(args.page, args.out, args.width, args.height, args.show_part or last_lesson_part())
    return 0


if __name__ == "__main__":
    sys.exit(main())
