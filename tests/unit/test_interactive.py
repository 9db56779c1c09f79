"""Interactive figures: precomputed frames and native HTML controls for the website (ac.interactive_figure)."""

from __future__ import annotations

import base64
import json
import re
import time

import matplotlib
import pytest
from bs4 import BeautifulSoup

import attention_course as ac
from attention_course import interactive

matplotlib.use("Agg")


@pytest.fixture
def shown(monkeypatch):
    """Build in static mode and collect what the helper displays instead of showing it."""
    monkeypatch.setenv(interactive.STATIC_ENV, "1")
    outputs = []
    monkeypatch.setattr("IPython.display.display", lambda obj, raw=False: outputs.append(obj))
    return outputs


def draw_bar(beta=1.0, causal=False, scores="dot"):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2.0, 1.5))
    ax.bar(range(3), [beta, 2.0 if causal else 1.0, 3.0 if scores == "dot" else 0.5])
    ax.set_title(f"beta={beta} {scores} {'causal' if causal else 'full'}")
    return fig


def describe(beta=1.0, causal=False, scores="dot"):
    return f"Bar chart of three bars; the first is {beta:g} tall; mask {'causal' if causal else 'none'}; {scores}."


def parse(outputs) -> tuple[BeautifulSoup, dict]:
    assert len(outputs) == 1, "the helper displays exactly one output"
    document = BeautifulSoup(outputs[0]["text/html"], "html.parser")
    data = json.loads(document.select_one("script.ac-frames").string)
    return document, data


def test_one_frame_per_combination_of_control_values(shown):
    ac.interactive_figure(
        draw_bar,
        describe,
        beta=ac.Slider([0.5, 1, 2], label="β", value=1),
        causal=ac.Toggle(label="causal mask"),
        scores=ac.Choice({"dot product": "dot", "additive": "add"}, label="score"),
    )
    _, data = parse(shown)
    assert data["controls"] == ["beta", "causal", "scores"]
    assert sorted(data["frames"]) == sorted(f"{b}-{c}-{s}" for b in range(3) for c in range(2) for s in range(2))
    assert len(data["images"]) == 12, "every combination draws a different bar chart"


def test_alt_text_follows_the_values_of_each_frame(shown):
    ac.interactive_figure(
        draw_bar, describe, beta=ac.Slider([0.5, 1, 2], label="β", value=2), causal=ac.Toggle(label="causal")
    )
    document, data = parse(shown)
    alts = {key: alt for key, (_, alt) in data["frames"].items()}
    assert len(set(alts.values())) == len(alts), "two frames share one alt text"
    assert alts["0-1"] == describe(beta=0.5, causal=True)
    assert alts["2-0"] == describe(beta=2, causal=False)
    # The image shown first is the initial values' frame, with that frame's alt text.
    image = document.select_one("img.ac-frame")
    assert image["alt"] == describe(beta=2, causal=False)
    first_image = data["images"][data["frames"]["2-0"][0]]
    assert image["src"] == first_image[0]
    assert shown[0]["text/plain"] == describe(beta=2, causal=False)


def test_frames_are_png_at_twice_the_displayed_size(shown):
    ac.interactive_figure(draw_bar, describe, beta=ac.Slider([0.5, 1], label="β"))
    _, data = parse(shown)
    for source, width, height in data["images"]:
        png = base64.b64decode(source.removeprefix("data:image/png;base64,"))
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        natural_width, natural_height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert abs(natural_width - 2 * width) <= 1 and abs(natural_height - 2 * height) <= 1
        assert 150 <= width <= 260, "a 2-inch figure at 100 dpi shows about 200 px wide"


def test_identical_frames_are_stored_once(shown):
    ac.interactive_figure(
        lambda beta, unused: draw_bar(beta), lambda beta, unused: f"bars at {beta} ({unused})",
        beta=ac.Slider([0.5, 1], label="β"), unused=ac.Toggle(label="does nothing"),
    )
    _, data = parse(shown)
    assert len(data["frames"]) == 4 and len(data["images"]) == 2


def test_frames_over_the_byte_budget_fail_with_a_clear_message(shown):
    with pytest.raises(ValueError, match=r"over the 0\.01 MB budget.*fewer values"):
        ac.interactive_figure(draw_bar, describe, beta=ac.Slider([0.5, 1, 2], label="β"), budget_bytes=10_000)
    # The default budget is 1 MB.
    assert interactive.FRAME_BUDGET_BYTES == 1_000_000


def test_too_many_frames_are_refused_before_drawing(shown):
    calls = []

    def draw(a, b):
        calls.append((a, b))
        return draw_bar()

    with pytest.raises(ValueError, match="81 frames"):
        ac.interactive_figure(draw, describe, a=ac.Slider(range(9), label="a"), b=ac.Slider(range(9), label="b"))
    assert not calls


def test_html_has_labelled_native_controls_with_values_in_the_readers_units(shown):
    ac.interactive_figure(
        draw_bar,
        describe,
        beta=ac.Slider([0.1, 1, 10], label="β (inverse temperature)", value=10, fmt="{:g}"),
        causal=ac.Toggle(label="causal mask", value=True),
        scores=ac.Choice({"dot product": "dot", "additive": "add"}, label="score"),
    )
    document, _ = parse(shown)
    figure = document.select_one("figure.ac-interactive")
    slider = figure.select_one('input[type="range"]')
    assert (slider["min"], slider["max"], slider["step"], slider["value"]) == ("0", "2", "1", "2")
    assert slider["aria-valuetext"] == "10", "screen readers hear beta itself, not the slider's position"
    assert json.loads(slider["data-labels"]) == ["0.1", "1", "10"]
    checkbox = figure.select_one('input[type="checkbox"]')
    assert checkbox.has_attr("checked")
    select = figure.select_one("select")
    assert [o.get_text() for o in select.find_all("option")] == ["dot product", "additive"]
    for control in (slider, checkbox, select):
        label = figure.select_one(f'label[for="{control["id"]}"]')
        assert label is not None and label.get_text().strip(), f"{control.name} has no visible label"
    assert figure.select_one("label").get_text() == "β (inverse temperature)"
    ids = [tag["id"] for tag in figure.find_all(id=True)]
    assert len(ids) == len(set(ids))
    # One small script switches frames; no widget state, no external scripts.
    scripts = document.find_all("script")
    assert all(not script.get("src") for script in scripts)
    assert "application/vnd.jupyter.widget" not in shown[0]["text/html"]


def test_text_becomes_a_choice_among_prepared_inputs_on_the_site(shown):
    ac.interactive_figure(
        lambda review: draw_bar(beta=len(review)),
        lambda review: f"Bars for the review {review!r}",
        review=ac.Text(["a fine film", "dull"], label="review"),
    )
    document, data = parse(shown)
    select = document.select_one("select")
    assert [o.get_text() for o in select.find_all("option")] == ["a fine film", "dull"]
    assert document.select_one(f'label[for="{select["id"]}"]').get_text() == "review"
    assert len(data["frames"]) == 2


def test_html_survives_values_that_look_like_markup(shown):
    ac.interactive_figure(
        lambda review: draw_bar(),
        lambda review: f"Bars for {review}",
        review=ac.Text(["</script><b>x", 'say "hi"'], label="<review>"),
    )
    document, data = parse(shown)
    assert data["frames"]["0"][1] == "Bars for </script><b>x"
    assert document.select_one("label").get_text() == "<review>"
    assert not document.find("b")


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: ac.Slider([1], label="beta"), ValueError, "at least two values"),
        (lambda: ac.Slider([1, 2], label="beta", value=3), ValueError, "initial value 3"),
        (lambda: ac.Slider([1, 2], label=""), ValueError, "label"),
        (lambda: ac.Slider([1.0, 1.0001], label="beta", fmt="{:.1f}"), ValueError, "same text"),
        (lambda: ac.Choice("ab", label="x"), TypeError, "list or a dict"),
        (lambda: ac.Toggle(label="x", value=1), TypeError, "True or False"),
        (lambda: ac.Text("one review", label="review"), TypeError, "list of strings"),
    ],
)
def test_bad_controls_are_refused(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_bad_calls_are_refused(shown):
    with pytest.raises(ValueError, match="at least one control"):
        ac.interactive_figure(draw_bar, describe)
    with pytest.raises(TypeError, match="control 'beta' must be"):
        ac.interactive_figure(draw_bar, describe, beta=[0.5, 1])
    with pytest.raises(ValueError, match="non-empty description"):
        ac.interactive_figure(draw_bar, lambda beta: " ", beta=ac.Slider([0.5, 1], label="β"))
    with pytest.raises(TypeError, match="must return a matplotlib Figure"):
        ac.interactive_figure(lambda beta: None, describe, beta=ac.Slider([0.5, 1], label="β"))


def test_static_mode_follows_the_environment(monkeypatch):
    monkeypatch.delenv(interactive.STATIC_ENV, raising=False)
    assert not interactive.static_figures()
    for value, expected in [("1", True), ("yes", True), ("0", False), ("", False)]:
        monkeypatch.setenv(interactive.STATIC_ENV, value)
        assert interactive.static_figures() is expected


def test_the_frame_switching_script_reads_every_control_kind():
    script = interactive._SCRIPT
    assert re.search(r'input\.type === "checkbox"', script)
    assert "aria-valuetext" in script and "image.alt = frame[1]" in script


def test_live_kernel_gets_widgets_that_redraw_with_alt_text(monkeypatch):
    widgets = pytest.importorskip("ipywidgets")
    monkeypatch.delenv(interactive.STATIC_ENV, raising=False)
    outputs = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kwargs: outputs.extend(objs))
    ac.interactive_figure(
        lambda review, **values: draw_bar(**values),
        lambda review, **values: describe(**values),
        beta=ac.Slider([0.5, 1, 2], label="β", value=2),
        causal=ac.Toggle(label="causal mask"),
        scores=ac.Choice({"dot product": "dot", "additive": "add"}, label="score"),
        review=ac.Text(["good"], label="review"),
    )
    (box,) = outputs  # one display: the controls and the figure's output area
    assert isinstance(box, widgets.VBox)
    row, area = box.children
    kinds = [type(control).__name__ for control in row.children]
    assert kinds == ["SelectionSlider", "Checkbox", "Dropdown", "Text"]
    controls = row.children
    assert controls[0].value == 2 and controls[0].description == "β"

    def frame():
        (output,) = area.outputs  # exactly one frame, replaced on every change
        tag = BeautifulSoup(output["data"]["text/html"], "html.parser").img
        assert tag["src"].startswith("data:image/png;base64,") and int(tag["width"]) > 100
        assert output["data"]["text/plain"] == tag["alt"]
        return tag["alt"]

    assert frame() == describe(beta=2)
    controls[0].value = 0.5
    assert frame() == describe(beta=0.5)
    controls[1].value = True
    assert frame() == describe(beta=0.5, causal=True)
    assert area.msg_id == "", "the frame is set as state, never captured (see test_live_figures_under_nbclient)"


LIVE_NOTEBOOK_CELLS = [
    """import attention_course as ac
import matplotlib.pyplot as plt
import numpy as np
ac.use_course_style()


def draw(k, causal=False, scores="dot", review="good"):
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    ax.plot(np.cos(np.arange(200)[:, None] * 0.01 * np.arange(1, k + 1)).sum(1))
    ax.set_title(rf"$d_{{\\mathrm{{model}}}} = {k}$, {scores}, {review}")
    return fig


def describe(k, causal=False, scores="dot", review="good"):
    return f"A line plot for k = {k}, causal {causal}, {scores} scores, review {review}."
""",
    "ac.interactive_figure(draw, describe, k=ac.Slider([4, 16, 64], label='k', fmt='{:d}'))",
    """ac.interactive_figure(
    draw, describe, k=ac.Slider([4, 16], label="k", fmt="{:d}"),
    causal=ac.Toggle(label="causal mask"),
    scores=ac.Choice({"dot product": "dot", "additive": "add"}, label="score"),
    review=ac.Text(["good", "bad"], label="review"),
)""",
]


@pytest.mark.slow
def test_live_figures_under_nbclient_send_nothing_back_and_finish_in_time(monkeypatch):
    """Live figures executed headless, as `make gpu-check` and the tests do, with no static switch.

    Output captured with ``with output:`` made nbclient's stand-in for the Output widget send each captured
    output back to the kernel over the shell channel while it waited there for the cell's reply; when the two
    crossed, the reply went unseen until the cell's timeout (chapters 07, 10b and 15 sat 90 to 250 s in their
    figure cells on a GPU runtime). The figure must reach the Output widget as state, so nothing is sent.
    """
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient, output_widget

    monkeypatch.delenv(interactive.STATIC_ENV, raising=False)
    sent = []
    original_send = output_widget.OutputWidget.send

    def counting_send(self, *args, **kwargs):
        sent.append(args)
        return original_send(self, *args, **kwargs)

    monkeypatch.setattr(output_widget.OutputWidget, "send", counting_send)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in LIVE_NOTEBOOK_CELLS]
    notebook.cells += [nbformat.v4.new_code_cell(LIVE_NOTEBOOK_CELLS[1]) for _ in range(4)]
    client = NotebookClient(notebook, timeout=60, kernel_name="python3")
    seconds = {}
    client.on_cell_start = lambda cell, cell_index: seconds.__setitem__(cell_index, time.perf_counter())
    client.on_cell_executed = lambda cell, cell_index, execute_reply: seconds.__setitem__(
        cell_index, time.perf_counter() - seconds[cell_index])
    client.execute()
    assert not sent, f"nbclient echoed {len(sent)} captured outputs back to the kernel"
    figure_cells = range(1, len(notebook.cells))
    assert all(seconds[index] < 20 for index in figure_cells), seconds
    outputs = [state["state"]["outputs"] for state in notebook.metadata.widgets[
        "application/vnd.jupyter.widget-state+json"]["state"].values() if state["model_name"] == "OutputModel"]
    assert len(outputs) == len(figure_cells)
    assert all(len(frame) == 1 and "<img alt=" in frame[0]["data"]["text/html"] for frame in outputs)


def test_show_figure_embeds_a_png_at_twice_its_displayed_size(monkeypatch):
    import matplotlib.pyplot as plt

    outputs = []
    monkeypatch.setattr("IPython.display.display", lambda obj: outputs.append(obj))
    fig, _ = plt.subplots(figsize=(3.0, 2.0))
    ac.show_figure(fig, alt="an empty plot")
    tag = BeautifulSoup(outputs[0].data, "html.parser").img
    png = base64.b64decode(tag["src"].removeprefix("data:image/png;base64,"))
    assert int.from_bytes(png[16:20], "big") >= 2 * int(tag["width"]) - 1
    assert 250 <= int(tag["width"]) <= 300, "a 3-inch figure at 100 dpi displays about 300 px wide (tight bbox)"


def test_library_source_is_collapsed_and_free_of_rest_markup():
    shown = ac.show(ac.scaled_dot_product_attention)
    document = BeautifulSoup(shown._repr_html_(), "html.parser")
    details = document.find("details", class_="library-source")
    assert details is not None and not details.has_attr("open"), "the source starts collapsed"
    assert "scaled_dot_product_attention" in details.summary.get_text()
    text = details.get_text()
    assert "``" not in text and ":func:`" not in text and ":class:`" not in text
    from attention_course.display import plain_docstring_markup

    assert plain_docstring_markup("Use :func:`~attention_course.masks.causal_mask` on ``(B, L)``.") == (
        "Use `causal_mask` on `(B, L)`."
    )
    assert plain_docstring_markup(":cite:p:`vaswani2017` and :class:`Tensor`") == "`vaswani2017` and `Tensor`"
