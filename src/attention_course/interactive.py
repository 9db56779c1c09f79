"""Interactive figures that respond in a live notebook and on the static website, from one call.

A lesson writes the figure once, as a function of its parameters, and lists the values each control offers::

    ac.interactive_figure(
        draw,   # draw(**values) -> matplotlib Figure (not shown: the helper shows it)
        alt,    # alt(**values) -> str, the alt text of THAT frame, generated from what it shows
        beta=ac.Slider([0.1, 0.3, 1, 3, 10], label="β (inverse temperature)", value=1),
        causal=ac.Toggle(label="causal mask"),
    )

In a live kernel (Jupyter, Colab, VS Code) the controls are ipywidgets and every change redraws the figure.
When the book is built (the environment variable ``ATTENTION_COURSE_STATIC_FIGURES`` is set, as ``make book``
does), there is no kernel behind the page: the helper draws every combination of control values once, as PNG
frames at twice the screen resolution, and emits native HTML controls (a range input, a select, a checkbox), each
with a visible label and its value announced in the reader's units, plus a few lines of JavaScript that switch
the image and its alt text. The website needs no widget manager, and the figure it shows is the one the controls
say. All frames of one figure together stay within ``FRAME_BUDGET_BYTES``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import itertools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "FRAME_BUDGET_BYTES",
    "MAX_FRAMES",
    "STATIC_ENV",
    "Choice",
    "Slider",
    "Text",
    "Toggle",
    "interactive_figure",
    "static_figures",
]

#: The environment variable that switches interactive figures to precomputed frames (set by ``make book``).
STATIC_ENV = "ATTENTION_COURSE_STATIC_FIGURES"
#: The most bytes of PNG frames one interactive figure may embed in a page (1 MB).
FRAME_BUDGET_BYTES = 1_000_000
#: The most frames (combinations of control values) one interactive figure may have.
MAX_FRAMES = 64
#: Frames are saved at this multiple of the figure's dpi, so they stay sharp on high-resolution screens.
FRAME_SCALE = 2


def static_figures() -> bool:
    """Whether interactive figures are drawn as precomputed frames (the book build) rather than as widgets."""
    return os.environ.get(STATIC_ENV, "").strip().lower() not in ("", "0", "false", "no")


class _Control:
    """One control: a label and a finite list of ``(shown text, value)`` options, one of them selected."""

    kind = "control"

    def __init__(self, options: Sequence[tuple[str, Any]], label: str, index: int) -> None:
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"a control needs a non-empty label (the reader sees it), got {label!r}")
        if len(options) == 0:
            raise ValueError(f"control {label!r} has no values to choose from")
        texts = [text for text, _ in options]
        if len(set(texts)) != len(texts):
            raise ValueError(f"control {label!r} shows the same text for two values: {texts}")
        self.options = list(options)
        self.label = label
        self.index = index

    @property
    def texts(self) -> list[str]:
        return [text for text, _ in self.options]

    @property
    def values(self) -> list[Any]:
        return [value for _, value in self.options]

    def widget(self):
        raise NotImplementedError

    def html(self, element_id: str, name: str) -> str:
        raise NotImplementedError


def _index_of(values: Sequence[Any], value: Any, label: str) -> int:
    for index, candidate in enumerate(values):
        if candidate == value:
            return index
    raise ValueError(f"control {label!r}: the initial value {value!r} is not one of its values {list(values)}")


class Slider(_Control):
    """A slider over a few chosen values (e.g. ``[0.1, 0.3, 1, 3, 10]`` for a parameter on a log scale).

    Args:
        values: the values the slider stops at, in order; every one of them is drawn for the website.
        label: what the reader sees next to the slider, with units if any (``"β (inverse temperature)"``).
        value: the initial value (default: the middle one).
        fmt: how a value is shown and announced to screen readers, e.g. ``"{:g}"`` or ``"{:d} tokens"``.
    """

    kind = "slider"

    def __init__(
        self, values: Sequence[Any], label: str, value: Any = None, fmt: str | Callable[[Any], str] = "{:g}"
    ) -> None:
        values = list(values)
        if len(values) < 2:
            raise ValueError(f"slider {label!r} needs at least two values, got {values}")
        show = fmt if callable(fmt) else fmt.format
        index = len(values) // 2 if value is None else _index_of(values, value, label)
        super().__init__([(show(v), v) for v in values], label, index)

    def widget(self):
        import ipywidgets as widgets

        return widgets.SelectionSlider(
            options=self.options,
            value=self.values[self.index],
            description=self.label,
            continuous_update=False,
            style={"description_width": "initial"},
            layout=widgets.Layout(width="min(100%, 28em)"),
        )

    def html(self, element_id: str, name: str) -> str:
        texts = self.texts
        return (
            f'<div class="ac-control ac-slider"><label for="{element_id}">{html.escape(self.label)}</label>'
            f'<input type="range" id="{element_id}" name="{html.escape(name)}" data-control="{html.escape(name)}"'
            f' min="0" max="{len(texts) - 1}" step="1" value="{self.index}"'
            f' aria-valuetext="{html.escape(texts[self.index])}"'
            f" data-labels='{html.escape(json.dumps(texts, ensure_ascii=False), quote=True)}'>"
            f'<output for="{element_id}" aria-hidden="true">{html.escape(texts[self.index])}</output></div>'
        )


class Choice(_Control):
    """A choice among a few options: a dropdown in a notebook, a select on the website.

    Args:
        options: a mapping from the text the reader sees to the value ``draw`` receives, or a list of values
            (each shown as ``str(value)``).
        label: what the reader sees next to the control.
        value: the initial value (default: the first option).
    """

    kind = "choice"

    def __init__(self, options: Mapping[str, Any] | Sequence[Any], label: str, value: Any = None) -> None:
        if isinstance(options, Mapping):
            pairs = [(str(text), option) for text, option in options.items()]
        elif isinstance(options, (str, bytes)):
            raise TypeError(f"choice {label!r}: options must be a list or a dict, got the string {options!r}")
        else:
            pairs = [(str(option), option) for option in options]
        values = [option for _, option in pairs]
        super().__init__(pairs, label, 0 if value is None else _index_of(values, value, label))

    def widget(self):
        import ipywidgets as widgets

        return widgets.Dropdown(
            options=self.options,
            value=self.values[self.index],
            description=self.label,
            style={"description_width": "initial"},
        )

    def html(self, element_id: str, name: str) -> str:
        options = "".join(
            f'<option value="{index}"{" selected" if index == self.index else ""}>{html.escape(text)}</option>'
            for index, text in enumerate(self.texts)
        )
        return (
            f'<div class="ac-control ac-choice"><label for="{element_id}">{html.escape(self.label)}</label>'
            f'<select id="{element_id}" name="{html.escape(name)}" data-control="{html.escape(name)}">'
            f"{options}</select></div>"
        )


class Toggle(_Control):
    """An on/off switch: a checkbox in a notebook and on the website; ``draw`` receives ``False`` or ``True``."""

    kind = "toggle"

    def __init__(self, label: str, value: bool = False) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"toggle {label!r}: value must be True or False, got {value!r}")
        super().__init__([("off", False), ("on", True)], label, int(value))

    def widget(self):
        import ipywidgets as widgets

        return widgets.Checkbox(value=bool(self.index), description=self.label, indent=False)

    def html(self, element_id: str, name: str) -> str:
        checked = " checked" if self.index else ""
        return (
            f'<div class="ac-control ac-toggle"><input type="checkbox" id="{element_id}" name="{html.escape(name)}"'
            f' data-control="{html.escape(name)}"{checked}>'
            f'<label for="{element_id}">{html.escape(self.label)}</label></div>'
        )


class Text(_Control):
    """Free text in a notebook; on the website, where nothing can run, a choice among prepared examples.

    Args:
        examples: prepared inputs; the website draws each of them, the notebook starts with the first
            (or ``value``) and lets the learner type anything.
        label: what the reader sees next to the control.
        value: the initial text (default: the first example).
    """

    kind = "text"

    def __init__(self, examples: Sequence[str], label: str, value: str | None = None) -> None:
        if isinstance(examples, str):
            raise TypeError(f"text {label!r}: examples must be a list of strings, got the string {examples!r}")
        examples = list(examples)
        if not all(isinstance(example, str) for example in examples):
            raise TypeError(f"text {label!r}: every example must be a string, got {examples!r}")
        super().__init__([(e, e) for e in examples], label, 0 if value is None else _index_of(examples, value, label))

    def widget(self):
        import ipywidgets as widgets

        return widgets.Text(
            value=self.values[self.index],
            description=self.label,
            continuous_update=False,
            style={"description_width": "initial"},
            layout=widgets.Layout(width="min(100%, 40em)"),
        )

    def html(self, element_id: str, name: str) -> str:
        return Choice(dict(self.options), self.label, self.values[self.index]).html(element_id, name).replace(
            "ac-choice", "ac-text", 1
        )


def _check_controls(controls: Mapping[str, Any]) -> dict[str, _Control]:
    if not controls:
        raise ValueError("interactive_figure needs at least one control, e.g. beta=ac.Slider([0.5, 1, 2], 'β')")
    for name, control in controls.items():
        if not isinstance(control, _Control):
            raise TypeError(
                f"control {name!r} must be ac.Slider, ac.Choice, ac.Toggle or ac.Text, got {type(control).__name__}"
            )
    return dict(controls)


def _alt_text(alt: Callable[..., str], values: Mapping[str, Any]) -> str:
    text = alt(**values)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"alt(**values) must return a non-empty description of the frame, got {text!r} for {values}")
    return text.strip()


def _png(fig: Figure) -> tuple[bytes, int, int]:
    """The figure as a PNG at FRAME_SCALE x its dpi, and its display size in CSS pixels; closes the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure as FigureClass

    if not isinstance(fig, FigureClass):
        raise TypeError(f"draw(**values) must return a matplotlib Figure, got {type(fig).__name__}")
    buffer = io.BytesIO()
    dpi = FRAME_SCALE * fig.dpi
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    data = buffer.getvalue()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    return data, round(width / FRAME_SCALE), round(height / FRAME_SCALE)


def _frames(
    draw: Callable[..., Figure], alt: Callable[..., str], controls: Mapping[str, _Control], budget: int
) -> tuple[dict[str, list], list[list]]:
    """Draw every combination of control values: ``(frames by key, images)``; identical images are kept once."""
    names = list(controls)
    grid = list(itertools.product(*(range(len(controls[name].options)) for name in names)))
    if len(grid) > MAX_FRAMES:
        sizes = " x ".join(f"{len(controls[name].options)} {name}" for name in names)
        raise ValueError(
            f"this interactive figure has {len(grid)} frames ({sizes}), more than the {MAX_FRAMES} a page may "
            "carry; offer fewer values per control"
        )
    frames: dict[str, list] = {}
    images: list[list] = []
    seen: dict[str, int] = {}
    total = 0
    for done, combination in enumerate(grid, start=1):
        values = {name: controls[name].values[index] for name, index in zip(names, combination)}
        text = _alt_text(alt, values)
        data, width, height = _png(draw(**values))
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen:
            seen[digest] = len(images)
            images.append(["data:image/png;base64," + base64.b64encode(data).decode("ascii"), width, height])
            total += len(data)
            if total > budget:
                projected = total * len(grid) / done
                raise ValueError(
                    f"interactive figure over its frame budget: {done} of {len(grid)} frames already take "
                    f"{total / 1e6:.2f} MB (about {projected / 1e6:.1f} MB for all), over the {budget / 1e6:g} MB "
                    "budget; offer fewer values per control, or draw a smaller figure (fewer panels, smaller "
                    "figsize, no per-cell numbers)"
                )
        frames["-".join(map(str, combination))] = [seen[digest], text]
    return frames, images


_SCRIPT = """<script>(function () {
  function setup(figure) {
    if (figure.dataset.acReady) return;
    figure.dataset.acReady = "1";
    var data = JSON.parse(figure.querySelector("script.ac-frames").textContent);
    var image = figure.querySelector("img.ac-frame");
    var inputs = data.controls.map(function (name) {
      return figure.querySelector('[data-control="' + name + '"]');
    });
    function update() {
      var key = inputs.map(function (input) {
        return input.type === "checkbox" ? (input.checked ? 1 : 0) : input.value;
      }).join("-");
      var frame = data.frames[key], source = data.images[frame[0]];
      image.src = source[0]; image.width = source[1]; image.height = source[2]; image.alt = frame[1];
      inputs.forEach(function (input) {
        if (input.type !== "range") return;
        var text = JSON.parse(input.dataset.labels)[input.value];
        input.setAttribute("aria-valuetext", text);
        var shown = figure.querySelector('output[for="' + input.id + '"]');
        if (shown) shown.textContent = text;
      });
    }
    inputs.forEach(function (input) {
      input.addEventListener("input", update);
      input.addEventListener("change", update);
    });
    // Fetch the other frames once the reader reaches for a control, not with the page.
    function preload() {
      data.images.forEach(function (source) { new Image().src = source[0]; });
    }
    figure.addEventListener("pointerenter", preload, {once: true});
    figure.addEventListener("focusin", preload, {once: true});
  }
  document.querySelectorAll("figure.ac-interactive").forEach(setup);
})();</script>"""

_counter = itertools.count()


def _static_html(
    draw: Callable[..., Figure], alt: Callable[..., str], controls: Mapping[str, _Control], budget: int
) -> str:
    frames, images = _frames(draw, alt, controls, budget)
    names = list(controls)
    start = "-".join(str(controls[name].index) for name in names)
    image_index, start_alt = frames[start]
    source, width, height = images[image_index]
    figure_id = "acfig-" + hashlib.sha256(start_alt.encode()).hexdigest()[:8] + f"-{next(_counter)}"
    control_html = "".join(controls[name].html(f"{figure_id}-{name}", name) for name in names)
    payload = json.dumps({"controls": names, "frames": frames, "images": images}, ensure_ascii=False)
    payload = payload.replace("</", "<\\/")  # never close the script element early
    return (
        f'<figure class="ac-interactive" id="{figure_id}">'
        f'<form class="ac-controls" aria-label="Figure controls" onsubmit="return false">{control_html}</form>'
        f'<img class="ac-frame" src="{source}" width="{width}" height="{height}" alt="{html.escape(start_alt)}">'
        f'<script type="application/json" class="ac-frames">{payload}</script>'
        f"</figure>{_SCRIPT}"
    )


def interactive_figure(
    draw: Callable[..., Figure],
    alt: Callable[..., str],
    *,
    budget_bytes: int = FRAME_BUDGET_BYTES,
    **controls: Slider | Choice | Toggle | Text,
) -> None:
    """Show a figure with controls: ipywidgets in a live kernel, precomputed frames on the website.

    Args:
        draw: ``draw(**values) -> Figure``, called with one value per control (keyword = control name). Do not
            show or close the figure; the helper does.
        alt: ``alt(**values) -> str``, the alt text of the frame drawn for those values. Generate it from the
            values and the data shown (what a reader who cannot see the image should learn from it).
        budget_bytes: the most bytes all frames together may take on the website (default 1 MB).
        **controls: the controls, by the name ``draw`` receives: :class:`Slider`, :class:`Choice`,
            :class:`Toggle`, :class:`Text`.

    Raises:
        ValueError: no controls, more than ``MAX_FRAMES`` combinations, an empty alt text, or frames over
            ``budget_bytes`` (the message says how far over and what to trim).
        TypeError: a control that is not one of the four kinds, or ``draw`` not returning a Figure.
    """
    from IPython.display import display

    controls = _check_controls(controls)
    if static_figures():
        text = _static_html(draw, alt, controls, budget_bytes)
        names = list(controls)
        start = {name: controls[name].values[controls[name].index] for name in names}
        display({"text/html": text, "text/plain": _alt_text(alt, start)}, raw=True)
        return
    _live_figure(draw, alt, controls)


def _live_figure(
    draw: Callable[..., Figure], alt: Callable[..., str], controls: Mapping[str, _Control]
) -> None:
    import ipywidgets as widgets
    from IPython.display import display

    inputs = {name: control.widget() for name, control in controls.items()}
    output = widgets.Output()

    def redraw(change: Any = None) -> None:
        values = {name: widget.value for name, widget in inputs.items()}
        image = _figure_html(draw(**values), _alt_text(alt, values))
        # The frame is set as the Output widget's state, not captured with ``with output:``. Capturing
        # makes a headless executor (nbclient, which runs the notebooks for the book, the tests and
        # `make gpu-check`) echo every captured output back to the kernel on the shell channel while
        # it waits there for the cell's reply; when the two cross, pyzmq's poll can miss the reply and
        # the cell sits until the executor's timeout (seen on a GPU runtime: 90 to 250 s). Setting the
        # state sends nothing back, and Jupyter, Colab and VS Code draw it the same way.
        output.outputs = ({"output_type": "display_data", "data": {"text/html": image, "text/plain": _plain(image)},
                           "metadata": {}},)

    for widget in inputs.values():
        widget.observe(redraw, names="value")
    redraw()
    row = widgets.HBox(list(inputs.values()), layout=widgets.Layout(flex_flow="row wrap"))
    display(widgets.VBox([row, output]))


def _plain(image_html: str) -> str:
    """The alt text of an ``<img>`` built by :func:`_figure_html`, for front ends that show no HTML."""
    start = image_html.index('alt="') + len('alt="')
    return html.unescape(image_html[start:image_html.index('"', start)])


def _figure_html(fig: Figure, alt: str) -> str:
    """``fig`` as an ``<img>`` carrying ``alt``, at twice its dpi and shown at its 1x size; closes it."""
    data, width, height = _png(fig)
    encoded = base64.b64encode(data).decode("ascii")
    return (f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{encoded}" '
            f'width="{width}" height="{height}"/>')
