"""Sphinx extension for the course website: what readers and learners get from the built pages.

- Exercise pages render the solution notebooks (``exercises/solutions/exNN_*.ipynb``), but learners must get the
  learner version: their Colab and download buttons open ``exercises/exNN_*.ipynb``, whose copy the build puts
  next to the page's own source in ``_sources/``.
- A hidden code cell that holds a solution says "Show solution" instead of "Show code cell source", and the
  ``### BEGIN SOLUTION`` / ``### END SOLUTION`` markers (for the notebook generator) are not shown.
- Images embedded in outputs as ``data:`` URIs (``ac.show_figure`` and the frames of ``ac.interactive_figure``)
  become files in ``_images/``: the page stays small, the browser caches them, and an interactive figure's
  frames load only when a reader moves its controls.
- Notebooks are executed before the build, in parallel, by ``_ext/course_execution.py`` into a jupyter-cache
  folder whose name hashes the course package (``execute_notebooks: cache``; this extension points MyST-NB at
  that folder). Each page's kernel CPU time comes from its cache record; a page MyST-NB executes itself
  during the build (a plain ``jupyter-book build``) is measured here instead (the build's children's CPU
  time before and after the page is read: the kernel is a child process, reaped when its notebook is done).
  Both are written, with the wall time, to ``_build/html/cpu-times.json`` and the Runtimes page's table
  (``{course-cpu-table}``). CPU time does not grow when other work shares the machine, so the runtime
  budgets are checked on it.
- Sphinx's module index names its collapse toggles "-"; they get alt text that says what they do.
- GPU runs recorded by ``make gpu-check`` on a GPU (``chapters/gpu_runs.json``) are listed on the Runtimes page
  (``{course-gpu-table}``): the latest run's time per notebook, with the GPU's name and the date. Nothing is
  shown as measured on a GPU unless such a run was recorded.
- The search ranks the lessons above the glossary and the exercise pages for a term they share.
- pybtex's plugin lookups are answered once per build (:func:`cache_pybtex_plugin_lookups`): uncached, they
  rescan every installed distribution some 860 times.
- Library source dumps (``ac.show``) and MathJax stay out of the keyboard's way (see _static/course.css and the
  MathJax settings in _config.yml).

Loaded through ``sphinx: local_extensions`` in _config.yml.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

LOGGER = logging.getLogger(__name__)

SOLUTIONS = "exercises/solutions/"
MARKER_LINE = re.compile(r"^[ \t]*#{2,3} ?(BEGIN|END) SOLUTION[ \t]*\n?", re.MULTILINE)
DATA_URI = re.compile(r"data:image/(png|jpeg|gif);base64,([A-Za-z0-9+/=\s]+?)(?=[\"'\\)])")
SHOW_SOLUTION, HIDE_SOLUTION = "Show solution", "Hide solution"


# --- exercise pages ---------------------------------------------------------------------------------------------


def learner_docname(docname: str) -> str | None:
    """``exercises/solutions/ex02_x`` -> ``exercises/ex02_x``; None for pages that are not solutions."""
    if not docname.startswith(SOLUTIONS):
        return None
    return "exercises/" + docname[len(SOLUTIONS) :]


def label_and_strip_solutions(app: Sphinx, doctree: nodes.document) -> None:
    """On exercise pages: name solution toggles "Show solution" and drop the solution marker lines."""
    docname = app.env.docname
    if not docname.startswith("exercises/"):
        return
    for cell in doctree.findall(nodes.container):
        if cell.get("nb_element") != "cell_code":
            continue
        blocks = [block for block in cell.findall(nodes.literal_block)]
        has_solution = any(MARKER_LINE.search(block.astext()) for block in blocks)
        if not has_solution:
            continue
        if cell.get("hide_mode"):
            cell["prompt_show"], cell["prompt_hide"] = SHOW_SOLUTION, HIDE_SOLUTION
        for block in blocks:
            text = block.astext()
            if MARKER_LINE.search(text):
                stripped = MARKER_LINE.sub("", text)
                block.rawsource = stripped
                block.children = [nodes.Text(stripped)]


def _rewrite_urls(item: Any, old: str, new: str) -> None:
    if isinstance(item, dict):
        for key, value in item.items():
            if key == "url" and isinstance(value, str):
                item[key] = value.replace(old, new)
            else:
                _rewrite_urls(value, old, new)
    elif isinstance(item, list):
        for value in item:
            _rewrite_urls(value, old, new)


def learner_buttons(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Point an exercise page's launch and download buttons at the learner notebook."""
    learner = learner_docname(pagename)
    if learner is None or "header_buttons" not in context:
        return
    source = Path(app.srcdir) / f"{learner}.ipynb"
    if not source.exists():
        LOGGER.warning(f"{pagename}: no learner notebook {learner}.ipynb to offer", type="course", subtype="learner")
        return
    target = Path(app.outdir) / "_sources" / f"{learner}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    _rewrite_urls(context["header_buttons"], f"{pagename}.ipynb", f"{learner}.ipynb")


# --- Jupyter widgets: none on the website ---------------------------------------------------------------------------

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# Widgets a reader would try to operate; progress bars (tqdm.auto: HBox, FloatProgress, HTML) are only frozen.
CONTROL_MODEL = re.compile(
    r"(Slider|Dropdown|Checkbox|Text|Textarea|Select|SelectMultiple|ToggleButtons?|RadioButtons|Button|Combobox"
    r"|Play|ColorPicker|DatePicker)Model$"
)


def drop_widgets(app: Sphinx, doctree: nodes.document) -> None:
    """Remove saved Jupyter widgets (tqdm's progress bars) and the 4 MB widget manager they would load.

    A widget needs a kernel; on the static site it can only be a frozen picture. Interactive figures come from
    ``ac.interactive_figure``, which needs no widget manager; a page that still saves a real control (a slider
    of ``ipywidgets.interact``) gets a warning, which fails the book build (``-W``).
    """
    docname = app.env.docname
    metadata = getattr(app.env, "nb_metadata", {}).get(docname, {})
    js_files = metadata.get("js_files", {})
    state = js_files.get("ipywidgets_state")
    if state:
        try:
            models = json.loads(state[1].get("body", "{}")).get("state", {})
        except ValueError:
            models = {}
        names = {model.get("model_name", "") for model in models.values()}
        controls = sorted(name for name in names if CONTROL_MODEL.search(name))
        if controls:
            LOGGER.warning(
                f"{docname}: saved Jupyter widgets with controls ({', '.join(controls)}) cannot work on the website; "
                "draw interactive figures with ac.interactive_figure",
                type="course",
                subtype="widget",
                location=docname,
            )
    for key in [key for key in js_files if key.startswith("ipywidgets")]:
        del js_files[key]
    for raw in list(doctree.findall(nodes.raw)):
        if WIDGET_VIEW in raw.astext():
            raw.parent.remove(raw)


# --- images embedded as data URIs -------------------------------------------------------------------------------


def externalize_images(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    """Write every ``data:image/...`` URI of the page body to ``_images/`` and link the file instead."""
    body = context.get("body")
    if not body or "data:image/" not in body:
        return
    images = Path(app.outdir) / "_images"
    images.mkdir(parents=True, exist_ok=True)
    pathto = context["pathto"]

    def replace(match: re.Match) -> str:
        kind, encoded = match.group(1), re.sub(r"\s+", "", match.group(2))
        data = base64.b64decode(encoded)
        name = f"inline-{hashlib.sha256(data).hexdigest()[:24]}.{'jpg' if kind == 'jpeg' else kind}"
        path = images / name
        if not path.exists():
            path.write_bytes(data)
        return pathto(f"_images/{name}", 1)

    context["body"] = DATA_URI.sub(replace, body)


# Accessibility of what MyST-NB and sphinxcontrib-bibtex write into the body:
# - a toggle's aria-label ("Toggle hidden content") hides its visible text ("Show solution") from screen readers;
# - a citation list's entries carry the deprecated role doc-biblioentry, which a role="list" may not contain.
BODY_FIXES = (
    ('<summary aria-label="Toggle hidden content">', "<summary>"),
    ('role="doc-biblioentry"', 'role="listitem"'),
)


def accessible_body(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    body = context.get("body")
    if body:
        for old, new in BODY_FIXES:
            body = body.replace(old, new)
        context["body"] = body


# --- kernel CPU time of each executed page -----------------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _execution():
    """``_ext/course_execution.py``, also when this file is loaded by path (the unit tests)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import course_execution

    return course_execution


def use_content_cache(app: Sphinx, config) -> None:
    """Point MyST-NB's cache at the folder ``course_execution`` fills for the current course package."""
    if config.nb_execution_mode == "cache" and not config.nb_execution_cache_path:
        config.nb_execution_cache_path = str(_execution().cache_folder(Path(app.srcdir)))


def cached_timing(app: Sphinx, source: str) -> dict[str, float] | None:
    """The kernel CPU and wall time stored with the notebook's cache record, if MyST-NB will use that record.

    A record without a kernel CPU time (one MyST-NB wrote itself) is removed, so that MyST-NB executes the
    notebook again now and the clock below measures it: no page is ever reported at zero seconds.
    """
    if app.config.nb_execution_mode != "cache" or not app.config.nb_execution_cache_path:
        return None
    import nbformat
    from jupyter_cache import get_cache

    execution = _execution()
    cache = get_cache(app.config.nb_execution_cache_path)
    notebook = nbformat.reads(source, as_version=4)
    try:
        record = cache.match_cache_notebook(notebook)
    except KeyError:
        return None
    data = record.data or {}
    if execution.CPU_KEY not in data or execution.CALIBRATION_KEY not in data:
        cache.remove_cache(record.pk)
        return None
    return timing(data[execution.CPU_KEY], data[execution.WALL_KEY], data[execution.CALIBRATION_KEY])


def timing(cpu_s: float, wall_s: float, calibration_cpu_s: float) -> dict[str, float]:
    """A page's record in cpu-times.json: its kernel CPU and wall seconds, the machine's calibration then, and
    the kernel CPU converted to the reference machine's seconds (``_ext/cpu_calibration.py``)."""
    _execution()  # puts _ext/ on sys.path
    import cpu_calibration

    reference = float(cpu_s) * cpu_calibration.REFERENCE_CPU_S / float(calibration_cpu_s)
    return {"cpu_s": round(float(cpu_s), 2), "wall_s": round(float(wall_s), 2),
            "calibration_cpu_s": round(float(calibration_cpu_s), 4), "reference_cpu_s": round(reference, 2)}


_build_calibration: list[float] = []  # measured once, when the build itself executes a page


def build_calibration() -> float:
    if not _build_calibration:
        _build_calibration.append(_execution().measure_calibration())
    return _build_calibration[0]


def start_clock(app: Sphinx, docname: str, source: list[str]) -> None:
    cached = None
    if (Path(app.srcdir) / f"{docname}.ipynb").exists():
        cached = cached_timing(app, source[0])
    app.env.course_clock = (docname, _children_cpu(), time.perf_counter(), cached)


def stop_clock(app: Sphinx, doctree: nodes.document) -> None:
    docname, cpu, wall, cached = getattr(app.env, "course_clock", (None, 0.0, 0.0, None))
    if docname != app.env.docname or not (Path(app.srcdir) / f"{docname}.ipynb").exists():
        return
    timings = getattr(app.env, "course_cpu_times", {})
    if cached is not None:
        timings[docname] = cached
    else:
        cpu_s, wall_s = _children_cpu() - cpu, time.perf_counter() - wall
        timings[docname] = timing(cpu_s, wall_s, build_calibration())
    app.env.course_cpu_times = timings


def purge_clock(app: Sphinx, env, docname: str) -> None:
    getattr(env, "course_cpu_times", {}).pop(docname, None)


def merge_clock(app: Sphinx, env, docnames, other) -> None:
    env.course_cpu_times = {**getattr(env, "course_cpu_times", {}), **getattr(other, "course_cpu_times", {})}


class cpu_table_placeholder(nodes.General, nodes.Element):
    """Replaced by the table of kernel CPU times once every page has been read."""


def fill_cpu_tables(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    timings = getattr(app.env, "course_cpu_times", {})
    for placeholder in list(doctree.findall(cpu_table_placeholder)):
        table = nodes.table(classes=["course-cpu-table"], ids=["kernel-cpu-times"])
        group = nodes.tgroup(cols=4)
        table += group
        group.extend(nodes.colspec(colwidth=width) for width in (52, 16, 16, 16))
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body

        def row(*cells: str) -> nodes.row:
            result = nodes.row()
            for cell in cells:
                entry = nodes.entry()
                entry += nodes.paragraph(text=cell)
                result += entry
            return result

        head += row("Page", "CPU (s)", "Reference (s)", "Wall (s)")
        for name in sorted(timings):
            t = timings[name]
            body += row(name, f"{t['cpu_s']:.1f}", f"{t['reference_cpu_s']:.1f}", f"{t['wall_s']:.1f}")
        totals = {key: sum(t[key] for t in timings.values()) for key in ("cpu_s", "reference_cpu_s", "wall_s")}
        body += row("Total", *(f"{value:.1f}" for value in totals.values()))
        placeholder.replace_self(table)


def write_cpu_times(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        timings = getattr(app.env, "course_cpu_times", {})
        path = Path(app.outdir) / "cpu-times.json"
        path.write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def cpu_table_directive():
    from docutils.parsers.rst import Directive

    class CourseCpuTable(Directive):
        """``{course-cpu-table}``: kernel CPU and wall time of every executed page, filled in at the end."""

        def run(self):
            return [cpu_table_placeholder()]

    return CourseCpuTable


# --- generated index pages ---------------------------------------------------------------------------------------

# Sphinx's domainindex.html gives the image that collapses a group of modules the alt text "-".
INDEX_TOGGLER = re.compile(
    r'(<img\b[^>]*\bclass="toggler"[^>]*?)\s+alt="-"\s*(/?>)(?P<rest>.*?<code class="xref">(?P<name>[^<]+)</code>)',
    re.DOTALL,
)


def describe_index_togglers(html: str) -> str:
    """Give each collapse toggle of a module index the alt text of what it does, naming its module."""

    def replace(match: re.Match) -> str:
        alt = f"Collapse or expand the submodules of {match.group('name')}"
        return f'{match.group(1)} alt="{alt}" {match.group(2)}{match.group("rest")}'

    return INDEX_TOGGLER.sub(replace, html)


def fix_index_pages(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    for page in Path(app.outdir).glob("*modindex.html"):
        html = page.read_text(encoding="utf-8")
        fixed = describe_index_togglers(html)
        if fixed != html:
            page.write_text(fixed, encoding="utf-8")


# --- bibliography labels that match the author-year citations ------------------------------------------------------


def author_year_label(entry) -> str:
    """``Vaswani et al., 2017``, ``Ba and Kiros, 2016`` or ``Srivastava, 2014``: the text of the citations."""
    from pybtex.richtext import Text

    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    lasts = [Text.from_latex(" ".join(person.last_names)).render_as("text") for person in persons]
    if len(lasts) >= 3:
        who = f"{lasts[0]} et al."
    elif len(lasts) == 2:
        who = f"{lasts[0]} and {lasts[1]}"
    elif lasts:
        who = lasts[0]
    else:
        who = Text.from_latex(entry.fields.get("title", entry.key)).render_as("text")
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


def cache_pybtex_plugin_lookups() -> None:
    """Keep the answers of pybtex's entry-point lookups for the build.

    pybtex 0.26 asks ``importlib.metadata.entry_points`` (a scan of every installed distribution) on every
    plugin lookup: about 860 scans, some 8 s of a 60 s site build on two cores (profiled). The installed
    distributions do not change during a build, so each lookup's answer is kept; pybtex's own runtime
    registry (``register_plugin``, used below) is separate and still consulted first.
    """
    import functools

    import pybtex.plugin

    lookup = pybtex.plugin.entry_points
    if getattr(lookup, "cache_info", None) is not None:  # already cached (Sphinx set up twice in one process)
        return

    @functools.cache
    def cached_lookup(**selection: str) -> tuple:
        return tuple(lookup(**selection))

    pybtex.plugin.entry_points = cached_lookup


def register_author_year_style() -> None:
    from pybtex.plugin import register_plugin
    from pybtex.style.formatting.unsrt import Style as UnsrtStyle
    from pybtex.style.labels import BaseLabelStyle

    class AuthorYearLabels(BaseLabelStyle):
        def format_labels(self, sorted_entries):
            labels = [author_year_label(entry) for entry in sorted_entries]
            for index, label in enumerate(labels):
                same = [i for i, other in enumerate(labels) if other == label]
                # Two works of the same authors and year: 2017a, 2017b (in the bibliography's order).
                yield label + ("abcdefghijklmnopqrstuvwxyz"[same.index(index)] if len(same) > 1 else "")

    class AuthorYearStyle(UnsrtStyle):
        default_label_style = AuthorYearLabels
        default_sorting_style = "author_year_title"

    register_plugin("pybtex.style.formatting", "course_author_year", AuthorYearStyle, force=True)

    # Citations in round brackets, as author-year citations are read: "Vaswani et al. (2017)", "(Ba et al., 2016)".
    import dataclasses

    import sphinxcontrib.bibtex.plugin
    from sphinxcontrib.bibtex.style.referencing import BracketStyle
    from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

    def round_brackets() -> BracketStyle:
        return BracketStyle(left="(", right=")")

    fields = ("bracket_textual", "bracket_parenthetical", "bracket_author", "bracket_label", "bracket_year")
    RoundStyle = dataclasses.make_dataclass(
        "CourseAuthorYearReferenceStyle",
        [(name, BracketStyle, dataclasses.field(default_factory=round_brackets)) for name in fields],
        bases=(AuthorYearReferenceStyle,),
    )
    sphinxcontrib.bibtex.plugin.register_plugin(
        "sphinxcontrib.bibtex.style.referencing", "course_author_year", RoundStyle, force=True
    )


# --- cross-references to re-exported names ---------------------------------------------------------------------


def _import_object(dotted: str):
    """The object a dotted name refers to (a module attribute, possibly nested), or None."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # not a module (or not importable): try a shorter prefix
            continue
        try:
            for attribute in parts[cut:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return None
        return obj
    return None


def resolve_reexports(app: Sphinx, env, node, contnode):
    """Resolve ``attention_course.KVCache`` (a re-export) to where it is documented (``...kv_cache.KVCache``).

    The library re-exports names from the top of the package; docstrings name them either way, the
    reference documents each once.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    if not target:
        return None
    module = node.get("py:module") or ""
    candidates = [target, f"{module}.{target}" if module else "", f"attention_course.{target}"]
    domain = env.get_domain("py")
    for name in filter(None, candidates):
        if not name.startswith("attention_course"):
            continue
        obj = _import_object(name)
        if obj is None:
            continue
        canonical = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        found = [canonical] if canonical in domain.objects else []
        if not found:  # a constant: find the documented name that holds the same object
            last = name.rsplit(".", 1)[-1]
            found = [
                documented
                for documented in domain.objects
                if documented.endswith("." + last) and _import_object(documented) is obj
            ]
        if found and found[0] != target:
            return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], found[0], node, contnode)
    return None


# --- GPU runs recorded by `make gpu-check` -------------------------------------------------------------------------

GPU_RUNS = "chapters/gpu_runs.json"


def gpu_run_table(runs: list[dict]) -> tuple[str, list[tuple[str, str, str]]] | None:
    """The latest recorded GPU run: a caption naming the GPU and the date, and one row per notebook
    ``(notebook, wall seconds on the GPU, "passed" or "failed")``; None when no run was recorded."""
    if not runs:
        return None
    run = runs[-1]
    caption = (f"Measured on {run['device']} on {run['date']} (PyTorch {run['torch']}, {run['parallel_notebooks']}"
               f" notebooks at once, {run['threads_per_kernel']} CPU threads each), by make gpu-check.")
    rows = [(name, "-" if entry["wall_s"] is None else f"{entry['wall_s']:.0f}",
             "passed" if entry["passed"] else "failed")
            for name, entry in sorted(run["notebooks"].items())]
    return caption, rows


def gpu_table_directive():
    from docutils.parsers.rst import Directive

    class CourseGpuTable(Directive):
        """``{course-gpu-table}``: the latest GPU run in chapters/gpu_runs.json, or a note that there is none."""

        def run(self):
            env = self.state.document.settings.env
            path = Path(env.srcdir) / GPU_RUNS
            if path.exists():
                env.note_dependency(str(path))  # a new run rebuilds the page
            table = gpu_run_table(json.loads(path.read_text(encoding="utf-8")) if path.exists() else [])
            if table is None:
                return [nodes.paragraph(text="No GPU run has been recorded yet: the times above are all the "
                                             "site reports.")]
            caption, rows = table
            result = nodes.table(classes=["course-gpu-table"], ids=["gpu-times"])
            group = nodes.tgroup(cols=3)
            result += group
            group.extend(nodes.colspec(colwidth=width) for width in (60, 20, 20))
            head, body = nodes.thead(), nodes.tbody()
            group += head
            group += body
            for target, cells in [(head, ("Notebook", "Wall on the GPU (s)", "Claims"))] + [(body, r) for r in rows]:
                row = nodes.row()
                for cell in cells:
                    entry = nodes.entry()
                    entry += nodes.paragraph(text=cell)
                    row += entry
                target += row
            return [nodes.paragraph(text=caption), result]

    return CourseGpuTable


# --- site-wide assets ---------------------------------------------------------------------------------------------


def setup(app: Sphinx) -> dict:
    cache_pybtex_plugin_lookups()
    register_author_year_style()  # bibtex_default_style: course_author_year (in _config.yml)
    app.connect("doctree-read", label_and_strip_solutions)
    app.connect("doctree-read", drop_widgets)
    app.connect("missing-reference", resolve_reexports)
    app.add_node(cpu_table_placeholder)
    app.add_directive("course-cpu-table", cpu_table_directive())
    app.add_directive("course-gpu-table", gpu_table_directive())
    app.connect("config-inited", use_content_cache)
    app.connect("source-read", start_clock)
    app.connect("doctree-read", stop_clock)
    app.connect("env-purge-doc", purge_clock)
    app.connect("env-merge-info", merge_clock)
    app.connect("doctree-resolved", fill_cpu_tables)
    app.connect("build-finished", write_cpu_times)
    app.connect("build-finished", fix_index_pages)
    # After the book theme has made its buttons (priority 501).
    app.connect("html-page-context", learner_buttons, priority=600)
    app.connect("html-page-context", externalize_images, priority=600)
    app.connect("html-page-context", accessible_body, priority=600)
    # course.js runs before searchtools.js (its Scorer ranks lessons first) and fixes the theme's accessibility.
    app.add_js_file("course.js", priority=100)
    app.add_css_file("course.css", priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
