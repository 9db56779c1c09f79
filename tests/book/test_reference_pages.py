"""The two reference pages of the built book: the library reference (autodoc) and the glossary."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from functools import cache
from types import ModuleType

import pytest

import attention_course
from tests.book.site import HTML, main_content, require_site, soup

pytestmark = pytest.mark.book

API_PAGE = HTML / "chapters" / "api.html"
GLOSSARY_PAGE = HTML / "chapters" / "glossary.html"

require_site()
for _page in (API_PAGE, GLOSSARY_PAGE):
    if not _page.exists():
        pytest.fail(f"{_page} is missing: run `make book` before the site tests", pytrace=False)

# Modules that are not library API: the benchmark runner (`make bench`) and the exercise definitions, whose
# contents the grader reads as data.
NOT_IN_REFERENCE = ("attention_course.benchmarks", "attention_course.grading.exercises.")

GLOSSARY_TERMS = [
    "additive attention",
    "alignment",
    "attention",
    "attention weights",
    "beam search",
    "BLEU",
    "causal mask",
    "cross-attention",
    "decoder",
    "dropout",
    "embedding",
    "encoder",
    "exact match",
    "feed-forward network",
    "greedy decoding",
    "hard attention",
    "head",
    "inverse temperature",
    "key",
    "KV cache",
    "label smoothing",
    "layer normalisation",
    "logits",
    "multi-head attention",
    "online softmax",
    "padding mask",
    "permutation equivariance",
    "positional encoding",
    "post-norm",
    "pre-norm",
    "query",
    "residual connection",
    "scaled dot-product attention",
    "score",
    "self-attention",
    "soft(arg)max",
    "teacher forcing",
    "tiled attention",
    "token",
    "value",
    "vocabulary",
    "warm-up",
]

CHAPTER_FILE = re.compile(r"\d\d[a-z]?_[a-z0-9_]+\.html")


# --- the library reference -----------------------------------------------------------------------------------


@cache
def documented_ids() -> frozenset[str]:
    """Anchors of the object descriptions autodoc wrote: ``<dt class="sig sig-object py" id="...">``."""
    return frozenset(dt["id"] for dt in main_content(API_PAGE).select("dt.sig-object[id]"))


def module_ids() -> set[str]:
    """Modules documented with ``automodule``: their sections carry ``id="module-<name>"``."""
    return {tag["id"].removeprefix("module-") for tag in soup(API_PAGE).find_all(id=re.compile(r"^module-"))}


def public_names() -> list[str]:
    """What ``import attention_course as ac`` offers: every public name except the submodules."""
    return sorted(
        name
        for name in dir(attention_course)
        if not name.startswith("_") and not isinstance(getattr(attention_course, name), ModuleType)
    )


@cache
def library_module_names() -> list[str]:
    """Every module of the package that belongs in the reference (found without importing the modules)."""
    return [
        info.name
        for info in pkgutil.walk_packages(attention_course.__path__, "attention_course.")
        if not info.name.endswith("__main__") and not info.name.startswith(NOT_IN_REFERENCE)
    ]


def candidate_ids(name: str) -> list[str]:
    """Where ``attention_course.<name>`` may be documented: at the top of the package or in its own module.

    Functions and classes know their module; a constant is found in every submodule that holds the same object.
    """
    obj = getattr(attention_course, name)
    candidates = [f"attention_course.{name}"]
    defining = getattr(obj, "__module__", None) if (inspect.isclass(obj) or inspect.isroutine(obj)) else None
    if defining:
        candidates.append(f"{defining}.{name}")
    else:
        candidates.extend(
            f"{module}.{name}"
            for module in library_module_names()
            if getattr(importlib.import_module(module), name, None) is obj
        )
    return candidates


def entry(object_id: str):
    """The ``<dl>`` of one documented object: its signature ``<dt>`` and description ``<dd>``."""
    dt = main_content(API_PAGE).find("dt", id=object_id)
    assert dt is not None, f"no entry {object_id!r} on the API page"
    return dt.parent


def test_public_names_are_found():
    names = public_names()
    assert len(names) >= 30, f"dir(attention_course) lists only {names}: is the package importable?"
    assert "scaled_dot_product_attention" in names and "Transformer" in names


@pytest.mark.parametrize("name", public_names())
def test_every_public_name_has_an_entry(name):
    ids = documented_ids()
    candidates = candidate_ids(name)
    assert any(candidate in ids for candidate in candidates), (
        f"attention_course.{name} is exported but chapters/api.md does not document it (looked for an entry "
        f"with id {' or '.join(candidates)}); add an autodoc directive for it"
    )


def test_entries_are_the_real_objects():
    """Every top-level entry names an object that ``attention_course`` really exports, so no stale entries."""
    exported = set(public_names())
    top_level = {object_id.split(".")[1] for object_id in documented_ids() if object_id.count(".") == 1}
    assert top_level, "no entry is documented as attention_course.<name>"
    stale = sorted(top_level - exported)
    assert not stale, f"the API page documents attention_course.{stale} that the package does not export"


@pytest.mark.parametrize("name", library_module_names())
def test_every_library_module_is_covered(name):
    """A module has a section (automodule), or every name in its ``__all__`` has an entry of its own."""
    module = importlib.import_module(name)
    if module.__name__ in module_ids():
        return
    exported = getattr(module, "__all__", None)
    assert exported, (
        f"{module.__name__} is neither documented with automodule on the API page nor has an __all__ "
        "whose names are documented one by one"
    )
    ids = documented_ids()
    missing = [
        name
        for name in exported
        if f"{module.__name__}.{name}" not in ids
        and not (hasattr(attention_course, name) and f"attention_course.{name}" in ids)
    ]
    assert not missing, f"{module.__name__}: {missing} have no entry on the API page (chapters/api.md)"


def test_google_docstring_sections_are_rendered():
    """napoleon turned ``Args:``/``Returns:`` into field lists: the text "Args:" never shows up literally."""
    sdpa = entry("attention_course.scaled_dot_product_attention")
    fields = {field.get_text("", strip=True).rstrip(":").strip() for field in sdpa.select("dl.field-list > dt")}
    assert {"Parameters", "Returns", "Raises"} <= fields, f"scaled_dot_product_attention's fields: {fields}"
    parameters = sdpa.select_one("dl.field-list > dd").get_text(" ", strip=True)
    for argument in inspect.signature(attention_course.scaled_dot_product_attention).parameters:
        assert argument in parameters, f"argument {argument!r} is not described in the Parameters field"
    text = main_content(API_PAGE).get_text("\n")
    for section in ("Args:", "Returns:", "Raises:"):
        lines = [line for line in text.splitlines() if line.strip() == section]
        assert not lines, f"{section!r} appears as plain text: napoleon did not convert a Google-style section"


def test_signatures_show_type_hints_and_link_library_types():
    mha = entry("attention_course.MultiHeadAttention.from_torch")
    signature = mha.find("dt").get_text("", strip=True)
    assert "module" in signature and "MultiHeadAttention" in signature, signature
    # the return annotation links back to the class's own entry
    targets = {a["href"].split("#")[-1] for a in mha.find("dt").find_all("a", href=True)}
    assert "attention_course.MultiHeadAttention" in targets, f"from_torch's return type links to {targets}"


# --- the glossary ------------------------------------------------------------------------------------------------


def glossary_entries() -> list[tuple[list[str], object]]:
    """``(terms, definition)`` for each entry: one or more ``<dt>`` terms followed by their ``<dd>``."""
    glossary = main_content(GLOSSARY_PAGE).find("dl", class_="glossary")
    assert glossary is not None, "the glossary page has no {glossary} list"
    entries, terms = [], []
    for child in glossary.find_all(["dt", "dd"], recursive=False):
        if child.name == "dt":
            terms.append(child.get_text("", strip=True).rstrip("¶#").strip())
        else:
            assert terms, "a glossary definition without a term"
            entries.append((terms, child))
            terms = []
    return entries


def test_glossary_has_many_entries():
    assert len(glossary_entries()) >= len(GLOSSARY_TERMS) - 5


@pytest.mark.parametrize("term", GLOSSARY_TERMS)
def test_glossary_defines_term(term):
    defined = {t.casefold() for terms, _ in glossary_entries() for t in terms}
    assert term.casefold() in defined, f"the glossary has no entry for {term!r}"


@pytest.mark.parametrize(
    "terms,definition", [pytest.param(terms, definition, id="/".join(terms)) for terms, definition in glossary_entries()]
)
def test_glossary_entry_links_to_a_chapter(terms, definition):
    chapters = []
    for anchor in definition.find_all("a", href=True):
        href = anchor["href"].split("#")[0]
        if CHAPTER_FILE.fullmatch(href.rsplit("/", 1)[-1]):
            target = (GLOSSARY_PAGE.parent / href).resolve()
            assert target.exists(), f"{terms}: the link {href} points at a missing page"
            chapters.append(target.name)
    assert chapters, f"the glossary entry {terms} links to no chapter (add 'Taught in {{doc}}`NN_...`')"
