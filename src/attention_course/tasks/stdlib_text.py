"""Real text without a download: the source code of the Python standard library (chapter 13's corpus).

Every Python installation carries its standard library as ``.py`` files (Colab included), so a language
model can train on real, human-written text that is already on the machine. :func:`load_stdlib_corpus`
reads the top-level modules of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``), in sorted order, and splits them **by file** into a training and a
validation set: a validation file is never seen in training, so the validation loss measures how well the
model predicts new code, not how well it remembers lines it has read.

The split is deterministic: a file goes to validation when the CRC-32 of its *name* falls in a fixed
residue class, so the same module lands on the same side on every machine and Python version. Each side is
capped at a fixed number of characters (files are taken whole, in sorted order, until the cap is reached),
so the work a lesson does on the corpus is bounded and about the same on Python 3.10 to 3.13, even though
their standard libraries differ.

Two kinds of top-level files are left out because they are not text anyone wrote as a module: the frozen-import
test fixtures (``__hello__.py``, ``__phello__*``) and the build configuration that ``sysconfig`` generates for
one machine (``_sysconfigdata_*.py``). Files are named relative to the standard library directory, so nothing
printed names the machine's own paths.

With ``packages=True`` the files inside the standard library's packages (``email/``, ``asyncio/``, ...) are
read too, about 12 MB of code instead of about 3 MB, leaving out their test suites (any folder named
``test``, ``tests`` or ``idle_test``) and installed third-party packages (``site-packages``). A package file is
named by its path relative to the standard library (``email/parser.py``), and the same rule splits it: the
CRC-32 of that name. A top-level file's name is its path, so the top-level files fall on the same side
either way, and they come first, so the validation text starts with the same files. The course model
(:mod:`attention_course.course_model`) trains on this larger split.

Nothing is written to disk and nothing is committed: the text is read at run time.
"""

from __future__ import annotations

import sys
import sysconfig
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from attention_course.checks import check_int

__all__ = ["StdlibCorpus", "load_stdlib_corpus", "stdlib_directory"]

#: Name prefixes of top-level files that are not modules written as text: import-system test fixtures and the
#: build configuration ``sysconfig`` writes for one machine.
SKIPPED_PREFIXES = ("__hello__", "__phello__", "_sysconfigdata_")

#: Folders whose files are not read with ``packages=True``: test suites and installed third-party packages.
SKIPPED_FOLDERS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


def stdlib_directory() -> Path:
    """The directory of the running interpreter's standard library (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass
class StdlibCorpus:
    """The training and validation text, and which files each came from.

    Attributes:
        train: the training files' text, concatenated (each file ends with a newline).
        valid: the validation files' text, concatenated.
        train_files: the names of the training files, in order.
        valid_files: the names of the validation files, in order.
        directory: where the files were read from.
    """

    train: str
    valid: str
    train_files: list[str] = field(default_factory=list)
    valid_files: list[str] = field(default_factory=list)
    directory: Path = field(default_factory=stdlib_directory)

    @property
    def source(self) -> str:
        """Where the files come from, without the machine's own path, such as
        ``"the standard library of Python 3.12"`` for the running interpreter's standard library, else the
        directory's last component."""
        if Path(self.directory) == stdlib_directory():
            return f"the standard library of Python {sys.version_info.major}.{sys.version_info.minor}"
        return f"{Path(self.directory).name}/"

    def file_texts(self, split: str) -> list[str]:
        """The text of each file of ``split`` (``"train"`` or ``"valid"``), one string per file, in order.

        Their concatenation is ``self.train`` (or ``self.valid``). A tokenizer that splits words at white space
        should encode file by file: a boundary inside a run of spaces changes how the run is split.
        """
        if split not in ("train", "valid"):
            raise ValueError(f"split must be 'train' or 'valid', got {split!r}")
        names = self.train_files if split == "train" else self.valid_files
        return [_read_text(Path(self.directory) / name) for name in names]

    def __repr__(self) -> str:
        return (f"StdlibCorpus(train={len(self.train):,} chars from {len(self.train_files)} files, "
                f"valid={len(self.valid):,} chars from {len(self.valid_files)} files, from {self.source})")


def _is_validation(name: str, valid_every: int) -> bool:
    return zlib.crc32(name.encode("utf-8")) % valid_every == 0


def _read_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text if text.endswith("\n") else text + "\n"


def _source_files(root: Path, packages: bool) -> list[Path]:
    """Top-level modules in sorted order, then (with ``packages``) the files inside packages, sorted by path."""
    top = sorted(path for path in root.glob("*.py") if not path.name.startswith(SKIPPED_PREFIXES))
    if not packages:
        return top
    inside = sorted(path for path in root.glob("*/**/*.py")
                    if not SKIPPED_FOLDERS.intersection(path.relative_to(root).parts[:-1]))
    return top + inside


def load_stdlib_corpus(
    max_train_chars: int = 600_000,
    max_valid_chars: int = 60_000,
    max_file_chars: int = 60_000,
    valid_every: int = 8,
    directory: str | Path | None = None,
    packages: bool = False,
) -> StdlibCorpus:
    """Read the standard library's top-level ``.py`` files and split them into training and validation text.

    Args:
        max_train_chars: stop adding training files once the training text has this many characters.
        max_valid_chars: the same for the validation text.
        max_file_chars: skip files longer than this (a few huge generated modules would dominate).
        valid_every: about one file in ``valid_every`` goes to validation (by a hash of its name).
        directory: read from here instead of the interpreter's standard library (for tests).
        packages: also read the files inside packages (without their test suites); see the module's text.

    Returns:
        A :class:`StdlibCorpus`. Files are read as UTF-8; a file that cannot be decoded is skipped, and so is a
        file whose name starts with one of ``SKIPPED_PREFIXES`` (test fixtures, generated configuration).

    Raises:
        ValueError: a non-positive size, or no files found.
    """
    for name, value in (("max_train_chars", max_train_chars), ("max_valid_chars", max_valid_chars),
                        ("max_file_chars", max_file_chars), ("valid_every", valid_every)):
        check_int(name, value)
    if not isinstance(packages, bool):
        raise TypeError(f"packages must be a bool, got {type(packages).__name__} {packages!r}")
    root = Path(directory) if directory is not None else stdlib_directory()
    paths = _source_files(root, packages)
    if not paths:
        raise ValueError(f"no .py files found in {root}")
    parts: dict[str, list[str]] = {"train": [], "valid": []}
    names: dict[str, list[str]] = {"train": [], "valid": []}
    sizes = {"train": 0, "valid": 0}
    limits = {"train": max_train_chars, "valid": max_valid_chars}
    for path in paths:
        name = path.relative_to(root).as_posix()
        split = "valid" if _is_validation(name, valid_every) else "train"
        if sizes[split] >= limits[split]:
            continue
        try:
            text = _read_text(path)
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > max_file_chars:
            continue
        parts[split].append(text)
        names[split].append(name)
        sizes[split] += len(text)
    return StdlibCorpus("".join(parts["train"]), "".join(parts["valid"]), names["train"], names["valid"], root)
