"""Show library source code inside a lesson, highlighted, in the book and in Colab."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

__all__ = ["show", "source_of"]


def source_of(obj: Any) -> str:
    """The source code of a library function, class or method, dedented."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError) as error:
        raise TypeError(f"cannot show the source of {obj!r}: {error}") from None


class _HighlightedSource:
    """Rich display object: highlighted HTML in notebooks and the book, plain text elsewhere."""

    def __init__(self, source: str, title: str) -> None:
        self.source = source
        self.title = title

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        formatter = HtmlFormatter(noclasses=True, style="default", nowrap=False)
        body = highlight(self.source, PythonLexer(), formatter)
        return (
            '<div class="library-source" style="border-left:4px solid #0072B2;padding-left:0.6em">'
            f'<p style="margin:0 0 0.3em 0;font-size:0.9em"><strong>Library source:</strong> '
            f"<code>{self.title}</code></p>{body}</div>"
        )

    def __repr__(self) -> str:
        return f"# {self.title}\n{self.source}"


def show(obj: Any) -> _HighlightedSource:
    """Display the source of a library object with syntax highlighting.

    Use it as the last expression of a cell: ``show(attention_course.causal_mask)``. In the book and in
    Jupyter or Colab it renders as highlighted HTML; in a terminal it prints as plain text.
    """
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return _HighlightedSource(source_of(obj), f"{module}.{name}" if module else name)
