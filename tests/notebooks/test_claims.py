"""Claims are code: every lesson guards the numbers and trends its prose states with asserts on the page."""

from __future__ import annotations

import pytest

from tests.notebooks.claims import ASSERT, CLAIM, claims_of
from tests.notebooks.notebook_files import LESSONS, relative

# A lesson that states results guards several of them; fewer than this means the pass was not done.
MIN_CLAIMS_PER_LESSON = 3


def test_the_claim_pattern_reads_the_convention():
    assert CLAIM.match("    # Claim: rows sum to one")["text"] == "rows sum to one"
    assert CLAIM.match("# claim: lower case is not the convention") is None
    assert CLAIM.match("x = 1  # Claim: trailing comments are not claims") is None


def test_guards_are_statements_that_raise():
    assert ASSERT.match("assert rows.sum() == 1")
    assert ASSERT.match("    torch.testing.assert_close(out, expected)")
    assert ASSERT.match("np.testing.assert_allclose(a, b)")
    assert not ASSERT.match("print('assert nothing')")
    assert not ASSERT.match("ok = torch.allclose(a, b)  # computed, never checked")
    assert not ASSERT.match("asserted = True")


@pytest.mark.parametrize("path", LESSONS, ids=relative)
def test_every_claim_is_followed_by_its_assert(path):
    unguarded = [claim for claim in claims_of(path) if not claim.guarded]
    assert not unguarded, "\n".join(
        f"{claim.notebook} cell {claim.cell}: '# Claim: {claim.text}' has no assert after it in its cell"
        for claim in unguarded
    )


@pytest.mark.parametrize("path", LESSONS, ids=relative)
def test_every_lesson_guards_its_claims(path):
    claims = claims_of(path)
    assert len(claims) >= MIN_CLAIMS_PER_LESSON, (
        f"{relative(path)} marks {len(claims)} claims with '# Claim:'; a lesson guards at least "
        f"{MIN_CLAIMS_PER_LESSON} of the numbers and trends its text states"
    )
    texts = [claim.text for claim in claims]
    duplicates = {text for text in texts if texts.count(text) > 1}
    assert not duplicates, f"{relative(path)}: the same claim is stated twice: {sorted(duplicates)}"
