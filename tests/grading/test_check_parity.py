"""The check sees what the grader sees: the notebook check judges the cells the grader will read.

The grader reads the saved notebook: for each part its graded cell (by tag), plus plain functions and imports
from the code cells still in it. The check runs in the kernel, which knows only what was executed. These
tests drive a real kernel the way JupyterLab does (each execute request carries ``cellId``, the cell's own
metadata and ``deletedCells``, the ids of the cells deleted since the previous request), on the generated
learner notebook (graded cells have the handed-out ids ``graded-<part>``), and compare the score the check
prints with the grader's score for the notebook as it would be saved, in two cases where they used to differ:

(a) the answer written in a new cell below the graded cell, which still holds the handed-out stub;
(b) a helper's cell deleted, and the check run again.

The same sessions without cell ids (plain IPython, older front ends: the kernel cannot tell cells apart)
show what the check did before cell ids were used (it passed both, the grader gives 0) and that it now says
so, in the note :data:`~attention_course.grading.checker.NO_CELL_IDS`.
"""

from __future__ import annotations

import copy
import os
import queue
import re
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from attention_course.grading import get_exercise
from attention_course.grading.checker import NO_CELL_IDS, CellLog
from attention_course.grading.grader import grade_notebook
from attention_course.grading.notebook_format import check_cell_id, graded_cell_id

jupyter_client = pytest.importorskip("jupyter_client")

ROOT = Path(__file__).resolve().parents[2]
HANDOUT = ROOT / "exercises" / "ex02_hard_and_soft_attention.ipynb"
PART = "soft_attention_weights"
STUB = 'raise NotImplementedError("replace this line with your code")'
SEED = 4321
_HEADER = re.compile(r"^(\w+) part \d+ of \d+: (\w+) \((\d+) points?\)$")
_RESULT = re.compile(r"^  (?:Passed: all \d+ cases|Not yet: \d+ of \d+ cases passed), ([0-9.]+) of (\d+) points\.$")
NOTE = NO_CELL_IDS.split(":")[0]  # "(This check cannot tell which notebook cell is which"


def last_shown(text: str, part: str) -> float:
    """The score the last check of ``part`` printed (0 for "not attempted" or a missing cell)."""
    score, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(2)
            if current == part:
                score = 0.0
        result = _RESULT.match(line)
        if result and current == part:
            score = float(result.group(1))
    assert score is not None, f"no check of {part} in the output:\n{text}"
    return score


class Kernel:
    """A real ipykernel, driven like JupyterLab (``lab=True``) or like a front end that sends no cell ids."""

    def __init__(self, lab: bool, timeout: float = 240) -> None:
        self.lab, self.timeout = lab, timeout  # timeout: a hang guard per message, not a budget
        self.deleted: list[str] = []
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.manager = jupyter_client.KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(ROOT), env=env)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=120)

    def delete(self, cell: nbformat.NotebookNode) -> None:
        """The learner deletes ``cell``: JupyterLab says so with the next execute request."""
        self.deleted.append(cell.id)

    def run(self, cell: nbformat.NotebookNode) -> str:
        """Execute ``cell``; its printed output (and any traceback)."""
        metadata = {}
        if self.lab:  # @jupyterlab/notebook runCell -> CodeCell.execute: the cell's metadata, deleted cells, its id
            metadata = {**copy.deepcopy(dict(cell.metadata)), "deletedCells": self.deleted, "recordTiming": False,
                        "cellId": cell.id}
            self.deleted = []
        content = {"code": cell.source, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True}
        message = self.client.session.msg("execute_request", content, metadata=metadata)
        self.client.shell_channel.send(message)
        texts: list[str] = []
        replied, deadline = None, time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                reply = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:  # iopub may drop messages under load: the shell reply says the cell is done
                replied = replied or self._replied(message["header"]["msg_id"])
                if replied is not None and time.monotonic() > replied + 5:
                    return "".join(texts)
                continue
            if reply["parent_header"].get("msg_id") != message["header"]["msg_id"]:
                continue
            kind, body = reply["msg_type"], reply["content"]
            if kind == "stream":
                texts.append(body["text"])
            elif kind == "error":
                texts.append("\n".join(body["traceback"]))
            elif kind == "status" and body["execution_state"] == "idle":
                return "".join(texts)
        raise TimeoutError(f"no reply to a cell within {self.timeout} s (a hang guard)")

    def _replied(self, msg_id: str) -> float | None:
        """When the shell channel's reply to ``msg_id`` came (now, if it is there), else ``None``."""
        while True:
            try:
                reply = self.client.get_shell_msg(timeout=0)
            except queue.Empty:
                return None
            if reply["parent_header"].get("msg_id") == msg_id:
                return time.monotonic()

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture()
def kernels():
    started: list[Kernel] = []

    def start(lab: bool) -> Kernel:
        started.append(Kernel(lab))
        return started[-1]

    yield start
    for kernel in started:
        kernel.close()


def _handout() -> nbformat.NotebookNode:
    return nbformat.read(HANDOUT, as_version=4)


def _cell(nb: nbformat.NotebookNode, cell_id: str) -> nbformat.NotebookNode:
    return next(cell for cell in nb.cells if cell.id == cell_id)


def _new_cell(source: str) -> nbformat.NotebookNode:
    """A code cell the learner adds: a fresh id, as JupyterLab gives it, and no metadata."""
    cell = nbformat.v4.new_code_cell(source)
    cell.id = uuid.uuid4().hex[:8]
    return cell


def _setup(kernel: Kernel, nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells[:4]:  # the Colab install (a no-op here), the preamble, `check = exercise("ex02")`
        if cell.cell_type == "code":
            assert "Traceback" not in kernel.run(cell)


def _graded(nb: nbformat.NotebookNode, tmp_path: Path, name: str) -> float:
    """The grader's score for ``PART`` of ``nb``, saved as the learner would save it."""
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    result = grade_notebook(path, seed=SEED, isolation="auto")
    return next(part.score for part in result.parts if part.part == PART)


ANSWER = ("def soft_attention_weights(scores, beta=1.0):\n"
          "    return torch.softmax(beta * scores, dim=-1)\n")


def _answer_in_a_new_cell(kernel: Kernel, tmp_path: Path) -> tuple[float, float, str]:
    """Case (a): the graded cell keeps its stub (and is run); the answer goes in a new cell below it."""
    nb = _handout()
    graded, check = _cell(nb, graded_cell_id(PART)), _cell(nb, check_cell_id(PART))
    below = _new_cell(ANSWER)
    nb.cells.insert(nb.cells.index(graded) + 1, below)
    _setup(kernel, nb)
    text = "".join(kernel.run(cell) for cell in (graded, below, check))
    return last_shown(text, PART), _graded(nb, tmp_path, "answer_in_new_cell"), text


def _helper_cell_deleted(kernel: Kernel, tmp_path: Path) -> tuple[float, float, float, float, str]:
    """Case (b): the graded cell calls a helper from a cell above it; checked, then that cell deleted and the
    check run again. Returns (shown, graded) before and after the deletion, and the outputs."""
    nb = _handout()
    graded, check = _cell(nb, graded_cell_id(PART)), _cell(nb, check_cell_id(PART))
    assert STUB in graded.source
    graded.source = graded.source.replace(STUB, "return torch.softmax(sharpen(scores, beta), dim=-1)")
    helper = _new_cell("def sharpen(scores, beta):\n    return beta * scores\n")
    nb.cells.insert(nb.cells.index(graded), helper)
    _setup(kernel, nb)
    text = "".join(kernel.run(cell) for cell in (helper, graded, check))
    before = last_shown(text, PART), _graded(nb, tmp_path, "with_helper")
    kernel.delete(helper)
    nb.cells.remove(helper)
    after_text = kernel.run(check)
    after = last_shown(after_text, PART), _graded(nb, tmp_path, "helper_deleted")
    return (*before, *after, text + after_text)


def test_learner_notebooks_hand_out_known_cell_ids():
    nb = _handout()
    ids = {cell.id for cell in nb.cells}
    assert {graded_cell_id(PART), check_cell_id(PART)} <= ids
    assert "graded" in _cell(nb, graded_cell_id(PART)).metadata["tags"]


def test_answer_in_a_new_cell_scores_as_in_the_grader(kernels, tmp_path):
    shown, graded, text = _answer_in_a_new_cell(kernels(lab=True), tmp_path)
    assert graded == 0, "the grader reads only the graded cell, which still holds the stub"
    assert shown == graded, text
    assert "defined in another cell than this part's graded cell" in " ".join(text.split()), text
    assert NOTE not in text, text


def test_deleted_helper_scores_as_in_the_grader(kernels, tmp_path):
    shown_before, graded_before, shown_after, graded_after, text = _helper_cell_deleted(kernels(lab=True), tmp_path)
    assert graded_before == 2 and shown_before == graded_before, text  # the helper carried, by both
    assert graded_after == 0, "the grader finds no cell that defines the helper"
    assert shown_after == graded_after, text
    assert "uses `sharpen`, defined in a cell you deleted" in " ".join(text.split()), text
    assert NOTE not in text, text


def test_graded_cell_cut_and_pasted_is_found_by_its_metadata(kernels, tmp_path):
    """JupyterLab gives a pasted cell a new id but keeps its metadata (tag ``graded``, its part), and sends that
    metadata with each execution: the check finds the graded cell there, as the grader finds it by its tag."""
    kernel = kernels(lab=True)
    nb = _handout()
    graded, check = _cell(nb, graded_cell_id(PART)), _cell(nb, check_cell_id(PART))
    _setup(kernel, nb)
    kernel.run(graded)  # the stub, as handed out
    pasted = copy.deepcopy(graded)
    pasted.id = uuid.uuid4().hex[:8]
    pasted.source = graded.source.replace(STUB, "return torch.softmax(beta * scores, dim=-1)")
    kernel.delete(graded)
    nb.cells[nb.cells.index(graded)] = pasted
    text = kernel.run(pasted) + kernel.run(check)
    shown = last_shown(text, PART)
    assert shown == _graded(nb, tmp_path, "pasted") == 2, text
    kernel.delete(pasted)  # and then deleted: no graded cell left for the part
    nb.cells.remove(pasted)
    text = kernel.run(check)
    assert last_shown(text, PART) == _graded(nb, tmp_path, "no_graded_cell") == 0, text
    assert "the graded cell of part 2 (under its heading, where you write `soft_attention_weights`) was deleted" \
        in " ".join(text.split()), text


@pytest.mark.parametrize("case", ["answer_in_a_new_cell", "helper_cell_deleted"])
def test_without_cell_ids_the_check_says_what_the_grader_reads(kernels, tmp_path, case):
    """No cell ids (plain IPython, older front ends): the check cannot see (a) or (b), judges as it did before
    cell ids were used (it passes, where the grader gives 0), and says, once, what the grader will read."""
    if case == "answer_in_a_new_cell":
        shown, graded, text = _answer_in_a_new_cell(kernels(lab=False), tmp_path)
    else:
        _, _, shown, graded, text = _helper_cell_deleted(kernels(lab=False), tmp_path)
    assert (shown, graded) == (2, 0), text
    assert text.count(NOTE) == 1, text
    assert "your front end does not send the id of the cell it runs" in " ".join(text.split()), text


def test_cell_log_keeps_the_latest_run_of_each_cell_not_deleted():
    """The record the check judges from, without a kernel: latest run per cell id, deletions as reported."""
    graded, check = graded_cell_id(PART), check_cell_id(PART)
    log = CellLog()
    log.record(graded, "stub", {"cellId": graded, "deletedCells": []})
    log.record("helper1", "def sharpen(s, b):\n    return b * s\n", {})
    log.record(graded, "answer", {})
    log.record(check, "check.soft_attention_weights(soft_attention_weights)", {"deletedCells": ["helper1"]})
    assert [(cell_id, run.source) for cell_id, run in log.present()] == \
        [(graded, "answer"), (check, "check.soft_attention_weights(soft_attention_weights)")]
    assert log.tracks_deletions and log.knows(get_exercise("ex02")) and not log.knows(get_exercise("ex03"))
    assert log.runs[graded].part == PART and log.runs[check].part is None
    log.record("helper1", "def sharpen(s, b):\n    return b * s\n", {})  # an undone deletion, run again
    assert "helper1" in dict(log.present())
    log.record(None, "x = 1", {})  # a front end that sends no id: nothing recorded, and it says so
    assert log.current is None and len(log.runs) == 3
    # A cell with another id that JupyterLab sends with the graded cell's metadata (a pasted copy) is graded.
    metadata = {"tags": ["graded"], "grading": {"part": "attention_pooling"}}
    log.record("pasted", "def attention_pooling(X, w): ...", metadata)
    assert log.runs["pasted"].part == "attention_pooling"
