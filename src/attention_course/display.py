"""Show library source code inside a lesson, highlighted, in the book and in Colab."""

from __future__ import annotations

import html
import inspect
import re
import textwrap
from typing import Any

__all__ = ["show", "source_of"]


def source_of(obj: Any) -> str:
    """The source code of a library function, class or method, dedented."""
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError) as error:
        raise TypeError(f"cannot show the source of {obj!r}: {error}") from None


# Sphinx roles (:func:`~a.b`, :class:`x`, :cite:p:`key`) and reST inline literals (``x``) in docstrings: the
# reference pages render them, a source listing shows them as plain `code`.
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def _role_text(match: re.Match) -> str:
    short, target = match.groups()
    target = target.split("<")[-1].rstrip(">") if "<" in target else target
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def plain_docstring_markup(source: str) -> str:
    """``source`` with reST roles and double-backtick literals turned into single-backtick code."""
    return _LITERAL.sub(r"`\1`", _ROLE.sub(_role_text, source))


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
        body = highlight(plain_docstring_markup(self.source), PythonLexer(), formatter)
        lines = self.source.count("\n") + 1
        # Collapsed: a lesson shows the library's version after building it step by step; the reader opens it.
        return (
            '<details class="library-source" style="border-left:4px solid #0072B2;padding-left:0.6em">'
            '<summary style="cursor:pointer;font-size:0.9em"><strong>Library source:</strong> '
            f"<code>{html.escape(self.title)}</code> ({lines} lines)</summary>{body}</details>"
        )

    def __repr__(self) -> str:
        return f"# {self.title}\n{self.source}"


def _library_object(path: str) -> Any:
    """``"module.name"`` inside attention_course (``"tiled._tiled_backward"``) -> that object."""
    import importlib

    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"name a library object as 'module.name' (e.g. 'tiled.tiled_attention'), got {path!r}")
    try:
        module = importlib.import_module(f"attention_course.{module_name}")
    except ModuleNotFoundError:
        raise ValueError(f"attention_course has no module {module_name!r} (from {path!r})") from None
    if not hasattr(module, attribute):
        raise ValueError(f"attention_course.{module_name} has no {attribute!r}")
    return getattr(module, attribute)


def show(obj: Any) -> _HighlightedSource:
    """Display the source of a library object with syntax highlighting.

    Use it as the last expression of a cell: ``show(attention_course.causal_mask)``. In the book and in
    Jupyter or Colab it renders as highlighted HTML; in a terminal it prints as plain text. ``obj`` may
    also name a library object by its path inside the package, ``show("tiled._tiled_backward")``: a
    helper that is not exported, shown without a deep import.
    """
    if isinstance(obj, str):
        obj = _library_object(obj)
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    return _HighlightedSource(source_of(obj), f"{module}.{name}" if module else name)
