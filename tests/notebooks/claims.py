"""The claims each lesson makes in prose and the asserts that guard them.

A lesson states a number, trend or comparison in its text and guards it in a code cell on the same page:

    # Claim: the weights of a tied row split evenly between the tied keys
    assert torch.allclose(weights[2, [2, 3]], torch.tensor([0.5, 0.5]))

Each ``# Claim:`` line must be followed, in the same cell, by an ``assert`` (or a testing assertion such as
``torch.testing.assert_close``) that guards it (several claims may
share one cell, each with its own assert after it). Run ``python -m tests.notebooks.claims`` for the list of
every lesson's claims, the coverage a reviewer reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.notebooks.notebook_files import LESSONS, read, relative

CLAIM = re.compile(r"^\s*# Claim:\s*(?P<text>.*\S)\s*$")
# An ``assert`` statement, or a call of a testing assertion that raises when the claim is false
# (``torch.testing.assert_close(...)``, ``np.testing.assert_allclose(...)``).
ASSERT = re.compile(r"^\s*(assert\b|([A-Za-z_]\w*\.)*assert_\w+\()")


@dataclass(frozen=True)
class Claim:
    notebook: str
    cell: int       # index of the code cell in the notebook, counting every cell
    text: str
    guarded: bool   # an ``assert`` follows the claim in the same cell, before the next claim


def claims_of(path: Path) -> list[Claim]:
    found = []
    for index, cell in enumerate(read(path).cells):
        if cell.cell_type != "code":
            continue
        lines = cell.source.splitlines()
        for number, line in enumerate(lines):
            match = CLAIM.match(line)
            if not match:
                continue
            following = []
            for later in lines[number + 1:]:
                if CLAIM.match(later):
                    break
                following.append(later)
            guarded = any(ASSERT.match(later) for later in following)
            found.append(Claim(relative(path), index, match["text"], guarded))
    return found


def all_claims() -> dict[str, list[Claim]]:
    return {relative(path): claims_of(path) for path in LESSONS}


if __name__ == "__main__":
    for notebook, claims in all_claims().items():
        print(f"{notebook}: {len(claims)} claims")
        for claim in claims:
            mark = "" if claim.guarded else "  (NO ASSERT)"
            print(f"  cell {claim.cell:3d}: {claim.text}{mark}")
