"""Plotting helpers with one consistent, accessible style.

Attention maps put queries on rows and keys on columns, label their tokens, carry a colourbar, and use a
perceptually uniform, colour-blind-safe colormap (viridis: brighter means more weight). Small maps also
print their numbers in the cells, so the figure reads without colour at all. Line plots use the
Okabe–Ito palette, which stays distinguishable under the common forms of colour blindness.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# pyplot is imported inside the functions that draw: a notebook that only imports the course (every graded
# exercise does) is spared half a second of matplotlib start-up.

__all__ = [
    "ATTENTION_CMAP",
    "DIVERGING_CMAP",
    "SAFE_COLORMAPS",
    "OKABE_ITO",
    "plot_attention",
    "plot_attention_grid",
    "show_figure",
    "use_course_style",
]

#: Sequential colormap for weights in [0, 1], perceptually uniform and colour-blind safe.
ATTENTION_CMAP = "viridis"
#: Diverging colormap for signed values (e.g. positional encodings), also colour-blind safe.
DIVERGING_CMAP = "RdBu_r"
#: The colormaps the course allows; tests check every helper uses one of these.
SAFE_COLORMAPS = frozenset({"viridis", "cividis", "magma", "inferno", "plasma", "RdBu_r", "PuOr", "Blues"})
#: Okabe & Ito (2008) qualitative palette, black first.
OKABE_ITO = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7")

#: Maps with at most this many cells print their values in each cell.
ANNOTATE_MAX_CELLS = 100


def use_course_style() -> None:
    """Set matplotlib defaults shared by every lesson: readable sizes, the Okabe–Ito colour cycle."""
    import matplotlib.pyplot as plt

    _use_retina_inline_figures()
    plt.rcParams.update(
        {
            "figure.dpi": 100,
            "savefig.dpi": 200,  # files saved by the lessons are 2x as well
            "font.size": 10,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.prop_cycle": plt.cycler(color=list(OKABE_ITO[1:]) + [OKABE_ITO[0]]),
            "image.cmap": ATTENTION_CMAP,
        }
    )


def _use_retina_inline_figures() -> None:
    """In IPython, show inline figures as PNGs at twice their dpi, sized to display at 1x (sharp, same layout).

    The PNG carries its 1x width and height as output metadata, which Jupyter, Colab and the book (MyST-NB)
    use as the image's displayed size.
    """
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with every notebook front end
        return
    if get_ipython() is None:
        return
    try:
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:  # pragma: no cover - an old IPython without matplotlib-inline
        return
    set_matplotlib_formats("retina")


def _as_matrix(weights: torch.Tensor | np.ndarray) -> np.ndarray:
    matrix = weights.detach().cpu().float().numpy() if isinstance(weights, torch.Tensor) else np.asarray(weights)
    if matrix.ndim != 2:
        raise ValueError(
            f"an attention map must be 2-D (queries, keys), got shape {tuple(matrix.shape)}; "
            "select one batch item and head first, e.g. weights[0, head]"
        )
    return matrix


def _check_labels(labels: Sequence[str] | None, size: int, rows_or_columns: str) -> None:
    if labels is not None and len(labels) != size:
        raise ValueError(f"got {len(labels)} labels for {size} {rows_or_columns}")


def plot_attention(
    weights: torch.Tensor | np.ndarray,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
    cmap: str = ATTENTION_CMAP,
    colorbar: bool = True,
    xlabel: str = "key",
    ylabel: str = "query",
) -> Axes:
    """Draw one attention map: queries on rows, keys on columns.

    Args:
        weights: ``(Lq, Lk)`` weights (or any 2-D matrix of scores; then pass ``vmin=vmax=None``).
        query_labels: ``Lq`` row labels (tokens); key_labels: ``Lk`` column labels.
        ax: axes to draw on (a new figure when omitted).
        annotate: print each cell's value; default: when the map has at most 100 cells.
        vmin, vmax: colour limits; weights live in [0, 1], so fixed limits make maps comparable.
        cmap: one of :data:`SAFE_COLORMAPS`.

    Returns:
        The axes drawn on.
    """
    matrix = _as_matrix(weights)
    if cmap not in SAFE_COLORMAPS:
        raise ValueError(f"cmap {cmap!r} is not one of the course's colour-blind-safe maps {sorted(SAFE_COLORMAPS)}")
    num_queries, num_keys = matrix.shape
    _check_labels(query_labels, num_queries, "queries (rows)")
    _check_labels(key_labels, num_keys, "keys (columns)")
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(0.55 * num_keys + 2.2, 0.5 * num_queries + 1.2))
    image = ax.imshow(matrix, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(num_keys), labels=key_labels if key_labels is not None else range(num_keys))
    ax.set_yticks(range(num_queries), labels=query_labels if query_labels is not None else range(num_queries))
    if key_labels is not None and max((len(str(label)) for label in key_labels), default=0) > 3:
        for label in ax.get_xticklabels():
            label.set(rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.spines[:].set_visible(False)
    if title:
        ax.set_title(title)
    if annotate is None:
        annotate = matrix.size <= ANNOTATE_MAX_CELLS
    if annotate:
        low, high = image.get_clim()
        middle = (low + high) / 2
        for row in range(num_queries):
            for col in range(num_keys):
                value = matrix[row, col]
                # Dark text on the bright end of the map, light text on the dark end.
                colour = "black" if value > middle else "white"
                ax.text(col, row, f"{value:.2f}", ha="center", va="center", color=colour, fontsize=8)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="weight" if vmax == 1.0 else None)
    return ax


def plot_attention_grid(
    maps: Sequence[torch.Tensor | np.ndarray],
    titles: Sequence[str],
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    *,
    ncols: int | None = None,
    annotate: bool | None = None,
    suptitle: str | None = None,
    panel_size: float = 2.6,
) -> Figure:
    """Small multiples: several attention maps side by side with one shared colour scale.

    Args:
        maps: a sequence of ``(Lq, Lk)`` maps with the same shape (e.g. one per head or per setting).
        titles: one title per map.
        ncols: panels per row (default: all in one row).

    Returns:
        The figure, with one colourbar for all panels.
    """
    if len(maps) == 0:
        raise ValueError("plot_attention_grid needs at least one map")
    if len(titles) != len(maps):
        raise ValueError(f"got {len(titles)} titles for {len(maps)} maps")
    matrices = [_as_matrix(m) for m in maps]
    shapes = {m.shape for m in matrices}
    if len(shapes) != 1:
        raise ValueError(f"all maps must have the same shape, got {sorted(shapes)}")
    ncols = ncols or len(matrices)
    nrows = -(-len(matrices) // ncols)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(panel_size * ncols + 1.0, panel_size * nrows + 0.4),
        squeeze=False,
        layout="constrained",
    )
    for index, ax in enumerate(axes.flat):
        if index >= len(matrices):
            ax.set_visible(False)
            continue
        first_column = index % ncols == 0
        plot_attention(
            matrices[index],
            query_labels,
            key_labels,
            ax=ax,
            title=titles[index],
            annotate=annotate,
            colorbar=False,
            ylabel="query" if first_column else "",
        )
        if not first_column:
            ax.set_yticklabels([])
    fig.colorbar(axes.flat[0].images[0], ax=axes, shrink=0.8, label="weight")
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def show_figure(fig: Figure, alt: str) -> None:
    """Display ``fig`` as a PNG image that carries ``alt`` text, then close it.

    Use it inside widget callbacks instead of ``plt.show()``. A widget's output is saved in the notebook's
    widget state and redrawn by the website without the cell metadata that gives ordinary figures their alt
    text; an HTML image keeps its description wherever it is shown (book, Jupyter, Colab, VS Code).
    """
    if not alt or not alt.strip():
        raise ValueError("alt text must describe the figure; got an empty string")
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display

    buffer = io.BytesIO()
    # Twice the figure's dpi, shown at its 1x size: sharp on high-resolution screens, same layout everywhere.
    fig.savefig(buffer, format="png", dpi=2 * fig.dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    data = buffer.getvalue()
    width, height = int.from_bytes(data[16:20], "big") // 2, int.from_bytes(data[20:24], "big") // 2
    encoded = base64.b64encode(data).decode("ascii")
    display(
        HTML(
            f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{encoded}" '
            f'width="{width}" height="{height}"/>'
        )
    )
