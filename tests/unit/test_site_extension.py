"""The course's Sphinx extension (_ext/course_site.py), tested without building the book."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("course_site", ROOT / "_ext" / "course_site.py")
course_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(course_site)


def test_solution_pages_map_to_learner_notebooks():
    assert course_site.learner_docname("exercises/solutions/ex02_hard") == "exercises/ex02_hard"
    assert course_site.learner_docname("chapters/02_hard") is None


def test_solution_markers_are_recognised_and_removed():
    source = "def f(x):\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n"
    assert course_site.MARKER_LINE.sub("", source) == "def f(x):\n    return x\n"
    assert not course_site.MARKER_LINE.search("# BEGIN SOLUTION is how the markers start")


def test_launch_and_download_urls_are_rewritten_to_the_learner_notebook():
    buttons = [
        {"type": "group", "buttons": [{"url": "https://colab/x/blob/main/exercises/solutions/ex02_a.ipynb"}]},
        {"url": "../../_sources/exercises/solutions/ex02_a.ipynb", "label": "download"},
    ]
    course_site._rewrite_urls(buttons, "exercises/solutions/ex02_a.ipynb", "exercises/ex02_a.ipynb")
    assert buttons[0]["buttons"][0]["url"].endswith("/blob/main/exercises/ex02_a.ipynb")
    assert buttons[1]["url"] == "../../_sources/exercises/ex02_a.ipynb"


def test_inline_images_become_files(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 20
    import base64

    encoded = base64.b64encode(png).decode()
    context = {
        "body": f'<img src="data:image/png;base64,{encoded}"/><script>{{"images": [["data:image/png;base64,{encoded}"'
        ", 1, 2]]}</script>",
        "pathto": lambda name, resource: f"../{name}",
    }
    app = SimpleNamespace(outdir=str(tmp_path))
    course_site.externalize_images(app, "chapters/x", "page.html", context, None)
    files = list((tmp_path / "_images").iterdir())
    assert len(files) == 1 and files[0].read_bytes() == png, "one file for the two copies of the same image"
    assert "data:image" not in context["body"]
    assert context["body"].count(f"../_images/{files[0].name}") == 2


@pytest.mark.parametrize(
    ("authors", "year", "label"),
    [
        (["Vaswani, Ashish", "Shazeer, Noam", "Parmar, Niki"], "2017", "Vaswani et al., 2017"),
        (["Ba, Jimmy Lei", "Kiros, Jamie Ryan"], "2016", "Ba and Kiros, 2016"),
        (["Nadaraya, E. A."], "1964", "Nadaraya, 1964"),
        (["G{\\\"o}del, Kurt"], "1931", "Gödel, 1931"),
    ],
)
def test_bibliography_labels_read_like_author_year_citations(authors, year, label):
    from pybtex.database import Entry, Person

    entry = Entry("article", fields={"year": year, "title": "T"}, persons={"author": [Person(a) for a in authors]})
    assert course_site.author_year_label(entry) == label


def test_widget_control_models_are_told_from_progress_bars():
    assert course_site.CONTROL_MODEL.search("IntSliderModel")
    assert course_site.CONTROL_MODEL.search("DropdownModel")
    for progress_bar_part in ("HBoxModel", "FloatProgressModel", "HTMLModel", "LayoutModel"):
        assert not course_site.CONTROL_MODEL.search(progress_bar_part)


def test_kernel_cpu_is_converted_to_the_reference_machines_seconds():
    course_site._execution()  # puts _ext/ on sys.path
    import cpu_calibration

    reference = cpu_calibration.REFERENCE_CPU_S
    # a machine half as fast as the reference ran the workload in twice the time: its 120 s are 60 reference s
    slower = course_site.timing(cpu_s=120.0, wall_s=150.0, calibration_cpu_s=2 * reference)
    assert slower == {"cpu_s": 120.0, "wall_s": 150.0, "calibration_cpu_s": round(2 * reference, 4),
                      "reference_cpu_s": 60.0}
    assert course_site.timing(cpu_s=45.0, wall_s=50.0, calibration_cpu_s=reference)["reference_cpu_s"] == 45.0


def test_a_cache_record_without_the_machines_calibration_is_executed_again(tmp_path):
    """A record from before the calibration (or written by MyST-NB) carries no speed: it cannot be judged."""
    execution = course_site._execution()
    with_calibration = SimpleNamespace(data={execution.CPU_KEY: 3.0, execution.CALIBRATION_KEY: 0.9})
    without = SimpleNamespace(data={execution.CPU_KEY: 3.0})
    for record, kept in ((with_calibration, True), (without, False)):
        cache = SimpleNamespace(match_cache_notebook=lambda notebook, record=record: record)
        assert (execution.cached_record(cache, None) is record) is kept
