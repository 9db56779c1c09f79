"""Exercise 07, positional encoding: the checks behind ``exercises/ex07_positional_encoding.ipynb``.

The learner writes the sinusoidal encoding (pairs from 0, sine and cosine interleaved), the profile
⟨PE(p), PE(p+k)⟩ = Σ_i cos(ω_i k), the shift by k as a rotation of every pair, and embeddings · √d_model plus
positions, then dropout. References: the library's table (float64) and closed forms. Recognised: pairs from 1,
sine and cosine swapped or concatenated, a column-index exponent, a backward rotation, a missing or misplaced
√d_model, missing positions, and dropout that is not inverted or not off in evaluation.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from attention_course.grading.compare import (
    close_problem,
    f64,
    finite_problem,
    fmt,
    matches,
    tensor_problem,
    value_error_problem,
)
from attention_course.grading.declare import Check, Out, View, mistakes_on
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_expecting_error,
    degenerate,
    diagnose,
    preamble,
    with_texts,
)

# The references run in the grader's process only: the sandbox's view of the package lacks them.
sinusoidal_positional_encoding = instructor_side("attention_course.positional", "sinusoidal_positional_encoding")

PREAMBLE = preamble()

_matches = functools.partial(matches, atol=1e-4, rtol=1e-4)  # this exercise's "the same tensor"


def _omega(d_model: int, first_pair: int = 0) -> torch.Tensor:
    """Angular speeds 10000^(-2i/d) for the d/2 pairs i = first_pair .. first_pair + d/2 - 1, float64."""
    i = torch.arange(first_pair, first_pair + d_model // 2, dtype=torch.float64)
    return 10000.0 ** (-2 * i / d_model)


# --- part 1: the sinusoidal encoding of given positions -----------------------------------------------
def _encoding(positions: torch.Tensor, d: int, first_pair: int = 0) -> torch.Tensor:
    """Reference PE rows (float64) for 1-D ``positions``; ``first_pair=1`` gives the off-by-one-pair version."""
    angle = f64(positions).unsqueeze(1) * _omega(d, first_pair)  # (P, d/2)
    table = torch.empty(len(positions), d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table


def _encoding_cases(g: torch.Generator) -> list[Case]:
    random_positions = (torch.rand(12, generator=g) * 500).round()  # integer-valued, in no particular order
    return [
        Case("positions 0..9, d_model = 8", (torch.arange(10, dtype=torch.float32), 8)),
        Case("positions 0..49, d_model = 16", (torch.arange(50, dtype=torch.float32), 16)),
        degenerate(Case("position 0 alone: (0, 1, 0, 1, ...)", (torch.zeros(1), 12))),
        Case("12 random positions up to 500, in no order, d_model = 64", (random_positions, 64)),
        Case("fractional positions (the formula holds for any real p), d_model = 6",
             (torch.rand(5, generator=g) * 20, 6)),
        degenerate(Case("d_model = 2: a single sine/cosine pair", (torch.arange(20, dtype=torch.float32), 2))),
        Case("d_model = 7 is odd: must raise ValueError naming 7", (torch.arange(5, dtype=torch.float32), 7),
             data={"error": True}),
    ]


def _feature_index(positions: torch.Tensor, d: int) -> torch.Tensor:
    feature = torch.arange(d, dtype=torch.float64)  # exponent 2j/d with the column index j instead of 2i/d
    wrong_angle = f64(positions).unsqueeze(1) * 10000.0 ** (-2 * feature / d)
    return torch.where(feature % 2 == 0, torch.sin(wrong_angle), torch.cos(wrong_angle))


_ENCODING_MISTAKES = (  # (positions, d_model) -> a wrong table
    Mistake(functools.partial(_encoding, first_pair=1),
            "your pairs are counted from 1 (frequencies 10000^(-2i/d) for i = 1 .. d/2); they run "
            "i = 0 .. d/2 - 1, so the first pair has wavelength 2*pi"),
    Mistake(lambda p, d: _encoding(p, d).reshape(len(p), -1, 2).flip(-1).reshape(len(p), d),
            "your even columns hold cosines and the odd ones sines; PE[p, 2i] = sin(...), PE[p, 2i+1] = cos(...)"),
    Mistake(lambda p, d: torch.cat([_encoding(p, d)[:, 0::2], _encoding(p, d)[:, 1::2]], dim=1),
            "your rows put all sines first and all cosines after; interleave them: column 2i is the sine "
            "and column 2i+1 the cosine of pair i"),
    Mistake(lambda p, d: _encoding(f64(p) + 1, d),
            "your rows are those of positions p + 1: the table starts at position 0, whose row is "
            "(sin 0, cos 0, ...) = (0, 1, 0, 1, ...); use the positions as given"),
    Mistake(_feature_index,
            "your exponent uses the column index j (10000^(2j/d)); both columns of pair i share the "
            "frequency 10000^(-2i/d) with i = j // 2"),
)


def _position_zero(v: View) -> str | None:
    positions, d = v.args
    zero = (positions == 0).nonzero()
    if len(zero):
        row = f64(v.got.encoding[int(zero[0])])
        if not torch.allclose(row, torch.tensor([0.0, 1.0] * (d // 2), dtype=torch.float64), atol=1e-6):
            return f"your row for position 0 starts {[round(float(x), 3) for x in row[:6]]}; sin(0) = 0 and " \
                   "cos(0) = 1, so PE(0) = (0, 1, 0, 1, ...)"
    return None


def _library_rows(v: View) -> str | None:
    positions, d = v.args
    if not bool((positions == positions.round()).all()):  # integer positions are rows of the library's table
        return None
    table = sinusoidal_positional_encoding(int(positions.max()) + 1, d, dtype=torch.float64)
    return close_problem(v.got.encoding, table[positions.long()], "your encoding",
                         "rows of ac.sinusoidal_positional_encoding", atol=2e-4)


_ENCODING = Check(
    reference=lambda v: _encoding(*v.args),
    outputs=(Out("encoding", "sin/cos(p / 10000^(2i/d_model))", atol=2e-4),),
    raises=lambda v: ((v.args[1],), f"d_model = {v.args[1]} is odd, and the features come in sine/cosine pairs")
    if v.data.get("error") else None,
    mistakes=mistakes_on(_ENCODING_MISTAKES, lambda v: v.args, on="encoding"),
    matches=functools.partial(matches, atol=2e-4, rtol=1e-4),
    explain=(_position_zero, _library_rows),
)


# --- part 2: the dot-product profile -------------------------------------------------------------------
def _profile_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("offsets 0..9, d_model = 16", (torch.arange(10, dtype=torch.float32), 16)),
        Case("offsets 0, 1, 5, 37, 100, d_model = 64", (torch.tensor([0.0, 1.0, 5.0, 37.0, 100.0]), 64)),
        Case("negative offsets: the profile is symmetric", (torch.tensor([-7.0, -1.0, 0.0, 1.0, 7.0]), 32)),
        Case("a (3, 4) tensor of random integer offsets in -100..100, d_model = 128",
             ((torch.rand(3, 4, generator=g) * 200 - 100).round(), 128)),
        Case("random real offsets, d_model = 8", (torch.randn(6, generator=g) * 10, 8)),
        degenerate(Case("d_model = 2: cos(k)", (torch.arange(6, dtype=torch.float32), 2))),
    ]


def _zero_offset(v: View) -> str | None:
    offsets, d = v.args
    zero = (offsets == 0).flatten().nonzero()
    value = float(f64(v.got.profile).flatten()[int(zero[0])]) if len(zero) else d / 2
    if abs(value - d / 2) > 1e-3:
        return (f"at offset 0 your value is {fmt(value)}; <PE(p), PE(p)> = sum of d/2 terms sin^2 + cos^2 = "
                f"d_model / 2 = {d // 2}")
    return None


def _from_table(v: View) -> str | None:
    """The definition itself: <PE(p), PE(p + k)> from the library table, for the integer offsets."""
    offsets, d = v.args
    pe = sinusoidal_positional_encoding(210, d, dtype=torch.float64)
    flat = f64(v.got.profile).flatten()
    for index, offset in enumerate(offsets.flatten().tolist()):
        if offset != round(offset) or abs(offset) > 100:
            continue
        offset = int(offset)
        p = 103 if offset < 0 else 3
        dot = float(pe[p] @ pe[p + offset])
        if abs(float(flat[index]) - dot) > 2e-3:
            return (f"at offset {offset} your value is {fmt(float(flat[index]))}, but <PE(p), PE(p + {offset})> "
                    f"computed from the table is {fmt(dot)}")
    return None


_PROFILE = Check(
    reference=lambda v: torch.cos(v.x[0].unsqueeze(-1) * _omega(v.args[1])).sum(dim=-1),  # sum_i cos(omega_i k)
    outputs=(Out("profile", "sum_i cos(omega_i * k)", atol=2e-3, by_rows=False),),
    mistakes=(Mistake(lambda v: torch.cos(v.x[0].unsqueeze(-1) * 10000.0 ** (
        -torch.arange(v.args[1] // 2, dtype=torch.float64) / v.args[1])).sum(dim=-1) if v.args[1] > 2 else None,
        "your frequencies are 10000^(-i/d): the exponent is -2i/d_model (pair i holds columns 2i and 2i + 1)",
        on="profile"),),
    explain=(_zero_offset, _from_table),
)


# --- part 3: moving along by rotating ------------------------------------------------------------------
def _rotation(k: int, d: int) -> torch.Tensor:
    """Block-diagonal R_k (float64) with PE(p + k) = R_k PE(p) as column vectors."""
    R = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(_omega(d).tolist()):
        c, s = math.cos(w * k), math.sin(w * k)
        R[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
    return R


def _rotation_cases(g: torch.Generator) -> list[Case]:
    def shift(name: str, positions: list[int], d: int, k: int) -> Case:
        rows = sinusoidal_positional_encoding(max(positions) + 1, d)[positions]
        return Case(name, (rows, k), data={"positions": positions})

    return [
        shift("PE rows of positions 0..5, k = 1, d_model = 8: must give the rows of 1..6", list(range(6)), 8, 1),
        shift("PE rows of positions 10, 3, 40, k = 7, d_model = 16", [10, 3, 40], 16, 7),
        shift("PE rows of positions 5..9, k = -5: back to positions 0..4", list(range(5, 10)), 12, -5),
        Case("random vectors (4, 8), k = 3: lengths are preserved", (torch.randn(4, 8, generator=g), 3)),
        Case("a batch of random vectors (2, 3, 6), k = 100", (torch.randn(2, 3, 6, generator=g), 100)),
        degenerate(Case("k = 0 changes nothing", (torch.randn(3, 4, generator=g), 0))),
        degenerate(Case("d_model = 2, k = 2: one 2x2 block", (torch.randn(5, 2, generator=g), 2))),
    ]


def _reaches_positions(v: View) -> str | None:
    if "positions" not in v.data:
        return None
    k, d = v.args[1], v.args[0].shape[-1]
    targets = [p + k for p in v.data["positions"]]
    pe = sinusoidal_positional_encoding(max(targets) + 1, d, dtype=torch.float64)[targets]
    for row, (p, target) in enumerate(zip(v.data["positions"], targets)):
        gap = float((f64(v.got.result[row]) - pe[row]).abs().max())
        if gap > 1e-4:
            return f"your result for PE({p}) differs from PE({target}) = PE({p} + {k}) by up to {fmt(gap)}"
    return None


def _keeps_lengths(v: View) -> str | None:
    gap = float((f64(v.got.result).norm(dim=-1) - v.x[0].norm(dim=-1)).abs().max())
    if gap > 1e-4:
        return f"a rotation keeps lengths, but the length of one of your rows changed by {fmt(gap)}"
    return None


def _first_pair_only(v: View) -> torch.Tensor:
    rotation = torch.eye(v.args[0].shape[-1], dtype=torch.float64)
    rotation[:2, :2] = _rotation(v.args[1], v.args[0].shape[-1])[:2, :2]
    return v.x[0] @ rotation.T


_ROTATION = Check(
    reference=lambda v: v.x[0] @ _rotation(v.args[1], v.args[0].shape[-1]).T,  # rows: PE[p] R_kᵀ = PE[p + k]
    outputs=(Out("result", "x @ R_kᵀ (every pair rotated by omega_i * k)"),),
    mistakes=(Mistake(lambda v: v.x[0] @ _rotation(v.args[1], v.args[0].shape[-1]) if v.args[1] else None,
                      lambda v: f"your rotation moves backwards, to position p - {v.args[1]}: rotate each pair (a, b) "
                      "of features to (a cos t + b sin t, -a sin t + b cos t) with t = omega_i * k", on="result"),
              Mistake(lambda v: _first_pair_only(v) if v.args[0].shape[-1] > 2 and v.args[1] else None,
                      "you rotated only the first pair of features: every pair i turns, each by its own angle "
                      "omega_i * k", on="result")),
    explain=(_reaches_positions, _keeps_lengths),
)


# --- part 4: embeddings plus positions, then dropout ---------------------------------------------------
def _embed_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, B: int, L: int, vocab: int, d: int, max_len: int, p: float, training: bool,
             data: dict[str, Any] | None = None) -> Case:
        tokens = torch.randint(vocab, (B, L), generator=g)
        weight = torch.randn(vocab, d, generator=g) * d ** -0.5
        pe = sinusoidal_positional_encoding(max_len, d)
        return Case(name, (tokens, weight, pe), {"dropout_p": p, "training": training}, data or {})

    return [
        case("evaluation mode: tokens (2, 7), d_model = 16", 2, 7, 20, 16, 50, 0.1, False),
        case("evaluation mode ignores dropout_p = 0.5", 3, 5, 11, 8, 20, 0.5, False),
        case("a sequence exactly max_len long", 2, 10, 13, 12, 10, 0.1, False),
        case("training mode, dropout_p = 0: no dropout", 2, 6, 9, 8, 30, 0.0, True),
        case("training mode, dropout_p = 0.1 on (8, 64, 32)", 8, 64, 50, 32, 64, 0.1, True),
        case("training mode, dropout_p = 0.5 on (4, 50, 32)", 4, 50, 30, 32, 100, 0.5, True),
        case("12 tokens but only 10 positions: must raise ValueError naming 12 and 10", 2, 12, 9, 8, 10, 0.1, False,
             {"error": True}),
    ]


def _verify_embed(case: Case, output: Any) -> str | None:
    tokens, weight, pe = case.args
    p, training = case.kwargs["dropout_p"], case.kwargs["training"]
    L, d = tokens.shape[1], weight.shape[1]
    if case.data.get("error"):
        return value_error_problem(output, (L, pe.shape[0]),
                                   f"the sequences have {L} tokens but the table has only {pe.shape[0]} positions")
    embedded, positions = f64(weight)[tokens], f64(pe[:L])
    expected = embedded * math.sqrt(d) + positions  # before dropout
    mistakes = (  # what the learner computed before dropout instead
        Mistake(lambda: embedded + positions,
                f"multiply the embeddings by sqrt(d_model) = {fmt(math.sqrt(d))} before adding the positions"),
        Mistake(lambda: (embedded + positions) * math.sqrt(d),
                "you scaled the sum; scale only the embeddings by sqrt(d_model), then add the positions"),
        Mistake(lambda: embedded * d + positions,
                f"you multiplied the embeddings by d_model = {d}; the factor is sqrt(d_model)"),
        Mistake(lambda: embedded * math.sqrt(d), "you added no positions: add pe[:L], the first L rows of the table"),
    )

    def diagnosis(values: torch.Tensor, select: torch.Tensor | None = None) -> str | None:
        return diagnose(mistakes, values,
                        matches=lambda v, wrong: _matches(v, wrong if select is None else wrong[select]))

    problem = tensor_problem(output, "your output", expected.shape) or finite_problem(output, "your output")
    if problem:
        return problem
    out = f64(output)
    if not training or p == 0.0:
        zeros = float((out == 0).double().mean())
        if zeros > 0 and not _matches(out, expected):
            mode = "in evaluation mode (training=False)" if not training else "with dropout_p = 0"
            return Finding(f"{zeros:.0%} of your outputs are zero {mode}; dropout must then be the identity",
                           FailureKind.KNOWN_MISTAKE)
        return diagnosis(out) or close_problem(out, expected, "your output", "E[tokens] * sqrt(d_model) + PE[:L]")
    dropped = out == 0
    fraction = float(dropped.double().mean())
    if fraction == 0.0:
        return Finding(f"none of your outputs are zero: in training mode dropout must zero about {p:.0%} of the "
                       "entries", FailureKind.PROPERTY)
    if abs(fraction - p) > 0.04:
        return Finding(f"your dropout zeroed {fraction:.1%} of the entries, expected about {p:.0%} (dropout_p = {p})",
                       FailureKind.PROPERTY)
    kept = ~dropped
    if torch.allclose(out[kept], expected[kept], atol=1e-4, rtol=1e-4):
        return Finding(f"the entries your dropout keeps must be scaled by 1 / (1 - p) = {fmt(1 / (1 - p))} "
                       "(inverted dropout)", FailureKind.KNOWN_MISTAKE)
    return diagnosis(out[kept] * (1 - p), kept) or close_problem(
        out[kept], expected[kept] / (1 - p), "the entries your dropout keeps",
        "(E[tokens] * sqrt(d_model) + PE[:L]) / (1 - p)")


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex07.toml
    id="ex07", chapters=("07_positional_encoding",), preamble=PREAMBLE,
    parts=(
        Part("sinusoidal_encoding", points=2, make_cases=_encoding_cases, verify=_ENCODING, run=call_expecting_error),
        Part("offset_similarity", points=1, make_cases=_profile_cases, verify=_PROFILE),
        Part("shift_by_rotation", points=2, make_cases=_rotation_cases, verify=_ROTATION),
        Part("embed_with_positions", points=2, make_cases=_embed_cases, verify=_verify_embed, run=call_expecting_error),
    ),
))
