"""The nbval sanitizer (tests/nbval_sanitize.cfg): it hides what is measured and nothing that is computed.

nbval reads the file with its own parser (a ``regex:`` line followed at once by its ``replace:`` line); a rule it
cannot read is silently ignored, and a rule too broad hides a number a page states. Both are checked here on
outputs the book prints (the measured ones from chapters 10b, 11, 11b, 13, 16 and 17).
"""

from __future__ import annotations

import re

import pytest

from tests.book.nbval_reference import IGNORE_OUTPUT_TAG, SANITIZE, measured_cells, tag_measured_cells

nbval_plugin = pytest.importorskip("nbval.plugin")

RULES = nbval_plugin.get_sanitize_patterns(SANITIZE.read_text(encoding="utf-8"))


def sanitize(text: str) -> str:
    for regex, replace in RULES:
        text = re.sub(regex, replace, text)
    return text


def test_every_rule_is_read_by_nbval_and_explained():
    text = SANITIZE.read_text(encoding="utf-8")
    assert len(RULES) == text.count("\nregex: ") == text.count("\nreplace: ")
    for section in re.split(r"\n(?=\[)", text)[1:]:  # every rule's section starts with its explanation
        assert section.splitlines()[1].startswith("# "), section


# (two runs' outputs of the same cell) -> they must sanitize to the same text
MEASURED = [
    ("1000 steps in 149 s (float32), 3.7 passes", "1000 steps in 16 s (float32), 3.7 passes"),
    ("{'with cache': '18,345 tokens/s', 'without': '6,495 tokens/s'} speed-up 2.8x (CPU time, one thread)",
     "{'with cache': '29,824 tokens/s', 'without': '10,881 tokens/s'} speed-up 2.7x (CPU time, one thread)"),
    ("encoder-decoder       65,185           675         6.6      100.0%",
     "encoder-decoder       65,185           675        10.6      100.0%"),
    ("training (seed 0): 100%|##########| 400/400 [00:01<00:00, 8.50it/s]",
     "training (seed 0): 100%|##########| 400/400 [00:03<00:00, 2.10it/s]"),
    ("n grew 16x: linear part 22x, quadratic part 733x", "n grew 16x: linear part 19x, quadratic part 801x"),
    ("T = 16: 1.54, 1.15 ms", "T = 16: 1.61, 1.09 ms"),
    ("n =   512: linear part    10.40 ms, quadratic part    9.25 ms",
     "n =   512: linear part     9.87 ms, quadratic part    10.02 ms"),
    ("   16                  82%     97%             1.2x      1.3x",
     "   16                  80%     97%             1.2x      1.4x"),
    ("matrix product: 214.6 GFLOP/s; copy: 13.0 GB/s; balance point 16.4 FLOP/byte",
     "matrix product: 190.2 GFLOP/s; copy: 11.9 GB/s; balance point 15.9 FLOP/byte"),
    ("measured / modelled speed-up: 0.78, 0.81, 0.83\nbest draft length on this processor: k = 1, speed-up 0.89",
     "measured / modelled speed-up: 0.80, 0.79, 0.85\nbest draft length on this processor: k = 2, speed-up 0.91"),
    ("n = 1024: naive 16.9 ms, tiled (Python loops) 15.7 ms, ratio 0.93",
     "n = 1024: naive 17.2 ms, tiled (Python loops) 16.0 ms, ratio 0.95"),
    ("<Foo object at 0x7f3a2c1b5e10>", "<Foo object at 0x7f11d0a2c3b0>"),
    ("saved to /tmp/tmpa1b2c3d4/model.pt", "saved to /tmp/tmpz9y8x7w6/model.pt"),
]

# (two outputs that differ in a computed number) -> they must still differ after sanitizing
COMPUTED = [
    ("1000 steps in 16 s (float32), 3.7 passes over the training tokens; final training loss 3.095",
     "1000 steps in 16 s (float32), 3.7 passes over the training tokens; final training loss 3.096"),
    ("soft lookup : 55 min, 353 kcal, 7.0 ingredients", "soft lookup : 54 min, 353 kcal, 7.0 ingredients"),
    ("encoder-decoder       65,185           675         6.6      100.0%",
     "encoder-decoder       65,185           675         6.6       98.0%"),
    ("static: 361 steps, 2.10 tokens per step, 1,253 tokens/s; latency mean 180.4, max 313 steps",
     "static: 362 steps, 2.10 tokens per step, 1,253 tokens/s; latency mean 180.4, max 313 steps"),
    ("positions processed: 31 with the cache, 495 without", "positions processed: 32 with the cache, 495 without"),
    ("library, naive:    88.3 ms, peak  130.0 MiB, max error 2.2e-07",
     "library, naive:    88.3 ms, peak  130.0 MiB, max error 2.3e-07"),
]


@pytest.mark.parametrize(("first", "second"), MEASURED)
def test_measured_outputs_compare_equal(first, second):
    assert sanitize(first) == sanitize(second)


@pytest.mark.parametrize(("first", "second"), COMPUTED)
def test_computed_outputs_still_compare(first, second):
    assert sanitize(first) != sanitize(second)


def test_measured_cells_are_named_and_each_names_one_cell():
    import nbformat

    named = measured_cells()
    assert named and all(path.endswith(".ipynb") and snippets for path, snippets in named.items())
    lines = SANITIZE.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        if line.startswith("measured-output:"):  # each explained by the comment lines above it
            assert lines[number - 1].startswith(("# ", "measured-output:")), line
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)"),
                                               nbformat.v4.new_code_cell("x = time()  # measured")])
    tag_measured_cells(notebook, ["# measured"], "probe")
    assert [IGNORE_OUTPUT_TAG in cell.metadata.get("tags", []) for cell in notebook.cells] == [False, True]
    with pytest.raises(SystemExit, match="occurs in 0 code cells"):
        tag_measured_cells(notebook, ["not in any cell"], "probe")
