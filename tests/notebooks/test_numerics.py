"""The numerics tool reports a failing claim by cell, with the claim it guards, and passes a sound notebook."""

from __future__ import annotations

import nbformat
import pytest

from tests.notebooks.numerics import failures, main


def _notebook(tmp_path, *sources: str):
    path = tmp_path / "lesson.ipynb"
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)
    return path


def test_a_failing_claim_is_reported_with_its_cell_and_text(tmp_path):
    path = _notebook(tmp_path, "x = 0.1 + 0.2", "# Claim: the sum is exactly 0.3\nassert x == 0.3", "y = 1")
    found = failures(path)
    assert len(found) == 1, found
    assert found[0].startswith("cell 1: ") and "assert x == 0.3" in found[0]
    assert "the sum is exactly 0.3" in found[0]


def test_a_sound_notebook_has_no_failures(tmp_path):
    assert failures(_notebook(tmp_path, "# Claim: rounded, the sum is 0.3\nassert round(0.1 + 0.2, 9) == 0.3")) == []


def test_a_missing_notebook_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "absent.ipynb")])
    assert stopped.value.code == 2
    assert "no such notebook" in capsys.readouterr().err


def test_an_unknown_variant_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--variant", "quantum"])
    assert "invalid choice" in capsys.readouterr().err
