"""Exercise 13, decoder-only language models: the checks behind ``exercises/ex13_decoder_only_language_models.ipynb``.

The learner writes the shifted next-token loss (padding ignored), the top-k and top-p filters, sampling with a
temperature and those filters, one cached step of causal self-attention and (chapter 13b) RMSNorm. References are
float64 PyTorch (``F.cross_entropy``, ``F.rms_norm``, attention over the whole sequence) and the library's filters.
Recognised mistakes: targets not shifted, padding counted, the token crossing p dropped, temperature applied to
probabilities, a filter the draw ignores; for RMSNorm eps outside the root, the mean subtracted, the weight left
out, another dimension than the last, float16 squares. While the learner's RMSNorm runs, PyTorch's own is refused
(best effort: ``torch._C.DisableTorchFunction()`` steps round the refusal; see chapters/instructors.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from attention_course.grading.compare import f64, first_problem, matches, tensor_problem
from attention_course.grading.declare import Check, Out, View, mistakes_on
from attention_course.grading.findings import FailureKind, Finding, finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_expecting_error,
    degenerate,
    permutation,
    preamble,
    randn,
    with_texts,
)

# The references run in the grader's process only: the sandbox's view of the package lacks them.
chi_square_p_value = instructor_side("attention_course.sampling", "chi_square_p_value")
reference_top_k = instructor_side("attention_course.sampling", "top_k_filter")
reference_top_p = instructor_side("attention_course.sampling", "top_p_filter")

PREAMBLE = preamble()


# --- part 1: the shifted next-token loss -------------------------------------------------------------------
def _loss_cases(g: torch.Generator) -> list[Case]:
    def tokens(batch: int, length: int, vocab: int, low: int = 1) -> torch.Tensor:
        return torch.randint(low, vocab, (batch, length), generator=g)

    padded = tokens(3, 8, 12)
    padded[0, 5:] = 0
    padded[1, 3:] = 0  # very different amounts of padding: a mean of per-row means differs from the mean
    other_pad = tokens(2, 6, 9, low=0)
    other_pad = torch.where(other_pad == 4, torch.ones_like(other_pad), other_pad)
    other_pad[1, 4:] = 4
    return [
        Case("batch 2, length 6, vocabulary 11, no padding", (randn(g, 2, 6, 11), tokens(2, 6, 11)), {"pad_id": 0}),
        Case("padding (id 0) at the end of two rows, different lengths", (randn(g, 3, 8, 12, scale=2.0), padded),
             {"pad_id": 0}),
        Case("the padding id is 4, not 0", (randn(g, 2, 6, 9), other_pad), {"pad_id": 4}),
        Case("sequences of two tokens: one prediction each", (randn(g, 4, 2, 5), tokens(4, 2, 5)), {"pad_id": 0}),
    ]


def _loss(logits: torch.Tensor, predictions: slice, targets: torch.Tensor, pad_id: int) -> torch.Tensor:
    chosen = logits[:, predictions]
    return F.cross_entropy(chosen.reshape(-1, chosen.size(-1)), targets.reshape(-1), ignore_index=pad_id)


_UNSHIFTED = ("your loss compares the logits at position t with token t: position t must predict token "
              "t + 1 (drop the last position's logits and the first token)")
_LOSS_MISTAKES = (  # (logits, tokens, pad_id) -> a wrong loss
    Mistake(lambda logits, tokens, pad_id: _loss(logits, slice(None), tokens, pad_id), _UNSHIFTED),
    Mistake(lambda logits, tokens, pad_id: _loss(logits, slice(None, -1), tokens[:, :-1], pad_id), _UNSHIFTED),
    Mistake(lambda logits, tokens, pad_id: _loss(logits, slice(1, None), tokens[:, :-1], pad_id),
            "your shift goes the wrong way: the logits at position t predict the token at t + 1"),
    Mistake(lambda logits, tokens, pad_id: _loss(logits, slice(None, -1), tokens[:, 1:], -100),
            lambda logits, tokens, pad_id: f"your loss counts the padded targets (id {pad_id}): leave them out of "
            "the mean"),
)


_LOSS = Check(
    reference=lambda v: _loss(v.x[0], slice(None, -1), v.x[1][:, 1:], v.kwargs["pad_id"]),
    outputs=(Out("loss", scalar=True),),
    mistakes=mistakes_on(_LOSS_MISTAKES, lambda v: (*v.x, v.kwargs["pad_id"]), on="loss"),
    explain=(lambda v: None if math.isclose(float(v.got.loss), float(v.want.loss), rel_tol=1e-4, abs_tol=1e-5) else
             f"expected a loss of {float(v.want.loss):.5f} nats, got {float(v.got.loss):.5f}",),
)


# --- parts 2 and 3: the top-k and top-p filters -------------------------------------------------------------
def _top_k_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("logits (4, 10), k = 3", (randn(g, 4, 10), 3)),
        Case("k = 1 keeps only the largest", (randn(g, 3, 6), 1)),
        degenerate(Case("k larger than the vocabulary keeps everything", (randn(g, 2, 5), 8))),
        Case("leading dimensions: logits (2, 3, 7), k = 2", (randn(g, 2, 3, 7), 2)),
    ]


def _probs(*values: float) -> torch.Tensor:
    return torch.tensor(values).log()


def _top_p_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("probabilities (0.5, 0.3, 0.15, 0.05), p = 0.6: the token crossing p is kept",
             (_probs(0.5, 0.3, 0.15, 0.05)[None], 0.6)),
        Case("the favourite alone has 0.95 > p = 0.9", (_probs(0.95, 0.03, 0.02)[None], 0.9)),
        Case("unsorted probabilities (0.1, 0.6, 0.05, 0.25), p = 0.7", (_probs(0.1, 0.6, 0.05, 0.25)[None], 0.7)),
        Case("random logits (4, 20), p = 0.9", (randn(g, 4, 20, scale=2.0), 0.9)),
        # Degenerate: a filter that returns its input passes (and one that drops the crossing token passes or
        # not as float32 rounding of the last cumulative sum falls): it must pass, but earns nothing on its own.
        Case("p = 1 keeps every token", (randn(g, 2, 6), 1.0), credit=False),
        Case("leading dimensions: logits (2, 3, 8), p = 0.5", (randn(g, 2, 3, 8), 0.5)),
    ]


_FILTERED = "filtered logits"


def _kept_values(v: View) -> str | None:
    got, keep = getattr(v.got, _FILTERED), torch.isfinite(getattr(v.want, _FILTERED))
    if not torch.equal(f64(got)[keep], v.x[0][keep]):
        return "the kept logits must keep their values (set only the dropped ones to -inf)"
    if not bool((got[~keep] == -math.inf).all()):
        return "the dropped logits must be -inf (so that softmax gives them probability 0)"
    return None


def _filter_check(reference: Callable[..., torch.Tensor], what: str, too_few: str = "") -> Check:
    """A filter part: the tokens kept must be the library filter's, row by row (``what`` names the filter, e.g.
    "top-k with k"; ``too_few`` is added when fewer tokens were kept in all), with their values unchanged."""
    def kept(v: View) -> str | None:
        got, want = (torch.isfinite(getattr(t, _FILTERED)).reshape(-1, v.args[0].size(-1)) for t in (v.got, v.want))
        if torch.equal(got, want):
            return None
        row = int((got != want).any(dim=-1).nonzero()[0, 0])
        fewer = too_few if int(got.sum()) < int(want.sum()) else ""
        return (f"row {row}: you kept {int(got[row].sum())} tokens, {what} = {v.args[1]} keeps "
                f"{int(want[row].sum())}{fewer}")

    return Check(reference=lambda v: reference(*v.args), outputs=(Out(_FILTERED, finite=False),),
                 explain=(kept, _kept_values))


def _top_k_mistakes(v: View) -> str | None:
    """The tokens kept by a threshold strictly above the k-th largest logit, or by the k-th smallest."""
    got, (logits, k) = torch.isfinite(getattr(v.got, _FILTERED)), v.x[:2]
    if k > logits.size(-1) or torch.equal(got, torch.isfinite(getattr(v.want, _FILTERED))):
        return None
    if torch.equal(got, logits > torch.topk(logits, k, dim=-1).values[..., -1:]):
        return Finding(f"you dropped the k-th largest logit too (you kept {k - 1} per row): keep every logit at or "
                       "above the k-th largest", FailureKind.KNOWN_MISTAKE)
    if torch.equal(got, logits >= torch.topk(logits, k, dim=-1, largest=False).values[..., -1:]):
        return Finding("your threshold is the k-th smallest logit (torch.topk with largest=False): top-k keeps the "
                       "k largest", FailureKind.KNOWN_MISTAKE)
    return None


_TOP_K = _filter_check(reference_top_k, "top-k with k")
_TOP_K = dataclasses.replace(_TOP_K, explain=(_top_k_mistakes, *_TOP_K.explain))
_TOP_P = _filter_check(reference_top_p, "top-p with p", too_few=" (keep a token while the probability of the tokens "
                       "before it is below p, so that the token whose probability crosses p is kept too)")


# --- part 4: sampling ---------------------------------------------------------------------------------------
DRAWS = 4000
#: Significance of the sampling tests: a correct sampler fails a case with probability at most 2e-6 (two
#: tests), so a class of a thousand learners sees a false failure about once in 500 gradings.
SAMPLING_SIGNIFICANCE = 1e-6
_SAMPLING_DEFAULTS = {"temperature": 1.0, "top_k": None, "top_p": None}  # what the learner's function is given


def _sample_cases(g: torch.Generator) -> list[Case]:
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))

    def draws(name: str, logits: torch.Tensor, **kwargs: Any) -> Case:  # DRAWS rows, one distribution
        return Case(name, (logits.expand(DRAWS, logits.numel()).clone(),), kwargs, data={"seed": seed})

    base = torch.tensor([2.0, 1.0, 0.0, -1.0])
    return [
        # Degenerate for a sampler (no draw at all): it must pass, but earns no credit on its own.
        Case("temperature 0 is greedy: the argmax of each row", (randn(g, 3, 10),), {"temperature": 0.0},
             credit=False),
        draws(f"temperature 1, {DRAWS} draws from one distribution", base, temperature=1.0),
        draws(f"temperature 0.5, {DRAWS} draws", base, temperature=0.5),
        draws(f"temperature 2, top-k 2, {DRAWS} draws", base, temperature=2.0, top_k=2),
        draws(f"top-p 0.6 on probabilities (0.5, 0.3, 0.15, 0.05), {DRAWS} draws", _probs(0.5, 0.3, 0.15, 0.05),
              top_p=0.6),
        # Logits whose filtered distribution keeps three tokens (a single kept token would need no randomness).
        draws(f"temperature 0.8, top-k 3 and top-p 0.9 together, {DRAWS} draws",
              torch.tensor([1.5, 1.0, 0.5, 0.0, -0.5, -3.0])[permutation(g, 6)], temperature=0.8, top_k=3, top_p=0.9),
        # Where the filters disagree (top-k keeps 4, top-p then 2 of them: a sampler that skips top-p when top-k
        # is given draws the other two) and where the temperature moves the nucleus (filtering the untempered
        # logits keeps 2 tokens where 3 are right, or 3 where 2 are). Every kept token has probability >= 0.2
        # and every cumulative sum is >= 0.07 from p, so a right sampler passes and these mistakes fail on
        # every draw of the cases.
        draws(f"top-k 4 and top-p 0.6 disagree: top-p keeps 2 of the 4, {DRAWS} draws",
              _probs(0.45, 0.3, 0.15, 0.07, 0.03)[permutation(g, 5)], top_k=4, top_p=0.6),
        draws(f"temperature 2 widens the top-p 0.7 nucleus to 3 tokens, {DRAWS} draws",
              _probs(0.5, 0.25, 0.15, 0.1)[permutation(g, 4)], temperature=2.0, top_p=0.7),
        draws(f"temperature 0.5 narrows the top-p 0.8 nucleus to 2 tokens, {DRAWS} draws",
              _probs(0.5, 0.25, 0.15, 0.1)[permutation(g, 4)], temperature=0.5, top_p=0.8),
    ]


def _run_sample(obj: Any, case: Case) -> Any:
    """Draw three times: twice with generators seeded alike (the draws must repeat), once with another seed
    (they must change); and say whether the global random generator was left as it was."""
    kwargs = {**_SAMPLING_DEFAULTS, **case.kwargs}

    def draw(seed: int) -> Any:
        return obj(case.args[0].clone(), **kwargs, generator=torch.Generator().manual_seed(seed))

    if "seed" not in case.data:
        return draw(0)
    global_state = torch.random.get_rng_state()
    seed = case.data["seed"]
    draws = tuple(draw(s) for s in (seed, seed, seed + 1))
    return (*draws, bool(torch.equal(torch.random.get_rng_state(), global_state)))


def _expected_probs(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None) -> torch.Tensor:
    z = f64(logits) / temperature
    if top_k is not None:
        z = reference_top_k(z, top_k)
    if top_p is not None:
        z = reference_top_p(z, top_p)
    return torch.softmax(z, dim=-1)


def _draws_problem(output: Any, logits: torch.Tensor | None = None, kwargs: dict[str, Any] | None = None) -> str | None:
    """The three draws must repeat with one seed, change with another, and leave the global generator alone.
    Draws that are all one token, where the filtered softmax (of ``logits`` with ``kwargs``) keeps several, are
    told so (the filters are wrong), not told to use the generator."""
    if not isinstance(output, tuple) or len(output) != 4 or not isinstance(output[3], bool):
        return Finding("expected your function to return the tokens", FailureKind.TYPE)
    for draw in output[:3]:
        problem = tensor_problem(draw, "your tokens", (DRAWS,), floating=False)
        if problem:
            return problem
    if not torch.equal(output[0], output[1]):
        return "two calls with generators seeded alike gave different tokens: draw with the generator argument"
    if torch.equal(output[0], output[2]) and logits is not None and kwargs is not None:
        expected = _expected_probs(logits, **kwargs)
        first = output[0].reshape(-1)
        if bool((first == first[0]).all()) and int((expected > 0).sum()) > 1:
            kept = ", ".join(f"{float(q):.2f}" for q in expected[expected > 0])
            labels = (("top_k", "top-k"), ("top_p", "top-p"))
            filters = " and ".join(f"{label} = {kwargs[name]}" for name, label in labels
                                   if kwargs[name] is not None) or "no filter"
            return Finding(f"every draw gave token {int(first[0])}: your sampler keeps one token, but with "
                           f"{filters} and temperature {kwargs['temperature']:g} {int((expected > 0).sum())} "
                           f"tokens are kept (probabilities {kept}); check the filters your sampler applies",
                           FailureKind.PROPERTY)
    if torch.equal(output[0], output[2]):
        return ("two calls with generators seeded differently gave the same tokens: your draws must come from "
                "the generator argument (e.g. torch.multinomial(probs, 1, generator=generator)), not from a "
                "fixed rule or a seed of your own")
    if not output[3]:
        return ("your function changed PyTorch's global random generator (torch.manual_seed, or a draw without "
                "generator=...): draw with the generator argument only")
    return None


def _distribution_problem(tokens: torch.Tensor, logits: torch.Tensor, kwargs: dict[str, Any]) -> str | None:
    """Whether ``tokens``, drawn from the row ``logits``, follow its filtered softmax, independently."""
    vocabulary = logits.size(-1)
    expected = _expected_probs(logits, **kwargs)
    if (tokens < 0).any() or (tokens >= vocabulary).any():
        return f"token ids must lie in 0 .. {vocabulary - 1}"
    impossible = tokens[expected[tokens] == 0]
    if impossible.numel() or chi_square_p_value(torch.bincount(tokens, minlength=vocabulary),
                                                expected * DRAWS) < SAMPLING_SIGNIFICANCE:
        named = _named_sampler_mistake(tokens, logits, kwargs)
        if named:
            return Finding(named, FailureKind.KNOWN_MISTAKE)
    if impossible.numel():
        token = int(impossible[0])
        for name, label in (("top_p", "top-p"), ("top_k", "top-k")):  # which filter the draws ignore
            if kwargs[name] is not None and bool((_expected_probs(logits, **{**kwargs, name: None})[tokens] > 0).all()):
                return (f"you drew token {token}, which {label} = {kwargs[name]} removes (probability 0): "
                        f"your draws come from a distribution without the {label} filter; when {name} is "
                        f"given, apply your {name}_filter to the logits before the softmax you draw from")
        return (f"you drew token {token}, which the filters remove (probability 0): draw from the softmax "
                "of the filtered logits")
    counts = torch.bincount(tokens, minlength=vocabulary)
    frequencies = counts.double() / DRAWS
    if chi_square_p_value(counts, expected * DRAWS) < SAMPLING_SIGNIFICANCE:
        worst = int((frequencies - expected).abs().argmax())
        untempered = _expected_probs(logits, 1.0, kwargs["top_k"], kwargs["top_p"])
        hint = ""
        if kwargs["temperature"] != 1 and (frequencies - untempered).abs().max() < 0.04:
            hint = (" (your draws ignore the temperature: divide the logits by it, not the probabilities, "
                    "which renormalising undoes)")
        return (f"token {worst} was drawn {frequencies[worst]:.3f} of the time; its probability is "
                f"{expected[worst]:.3f}{hint}")
    # Each pair of consecutive rows' tokens must follow the product distribution (a sampler that walks through
    # the quantiles in order gives the right counts and sorted tokens).
    pairs = tokens[: DRAWS // 2 * 2].reshape(-1, 2)
    joint = torch.bincount(pairs[:, 0] * vocabulary + pairs[:, 1], minlength=vocabulary**2)
    if chi_square_p_value(joint, torch.outer(expected, expected).flatten() * pairs.size(0)) < SAMPLING_SIGNIFICANCE:
        return ("your draws are not independent from row to row (consecutive rows' tokens follow a pattern): "
                "draw each row at random, e.g. with torch.multinomial")
    return None


def _fits(tokens: torch.Tensor, probs: torch.Tensor) -> bool:
    """Whether ``tokens`` could have been drawn from ``probs`` (none impossible, counts not rejected)."""
    if bool((probs[tokens] == 0).any()):
        return False
    counts = torch.bincount(tokens, minlength=probs.numel())
    return chi_square_p_value(counts, probs * tokens.numel()) >= SAMPLING_SIGNIFICANCE


def _named_sampler_mistake(tokens: torch.Tensor, logits: torch.Tensor, kwargs: dict[str, Any]) -> str | None:
    """The known mistake whose distribution the draws follow (they do not follow the right one), if any."""
    temperature, top_k, top_p = kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]
    z = f64(logits)
    if temperature != 1 and _fits(tokens, _expected_probs(logits, 1.0, top_k, top_p)):
        return ("your draws ignore the temperature: divide the logits by it, not the probabilities (which "
                "renormalising undoes)")
    if top_k is not None and top_p is not None and _fits(tokens, _expected_probs(logits, temperature, None, None)):
        return "your draws ignore the filters: draw from the softmax of the filtered logits"
    if temperature != 1 and (top_k is not None or top_p is not None):
        early = z if top_k is None else reference_top_k(z, top_k)
        early = early if top_p is None else reference_top_p(early, top_p)
        if _fits(tokens, torch.softmax(early / temperature, dim=-1)):
            return (f"your draws follow the filters applied to the untempered logits, then the temperature: with "
                    f"temperature {temperature:g} the top-p nucleus is another set of tokens; divide the logits by "
                    f"the temperature first, then filter, then take the softmax")
    if top_k is not None and top_p is not None:
        if _fits(tokens, _expected_probs(logits, temperature, top_k, None)):
            return (f"your draws ignore top_p = {top_p} when top_k = {top_k} is given too: apply both filters, "
                    f"top-k and then top-p on what it keeps")
        if _fits(tokens, _expected_probs(logits, temperature, None, top_p)):
            return (f"your draws ignore top_k = {top_k} when top_p = {top_p} is given too: apply both filters, "
                    f"top-k and then top-p on what it keeps")
    return None


def _verify_sample(case: Case, output: Any) -> str | None:
    logits, kwargs = case.args[0], {**_SAMPLING_DEFAULTS, **case.kwargs}
    if kwargs["temperature"] == 0:
        return first_problem(
            lambda: tensor_problem(output, "your tokens", logits.shape[:-1], floating=False),
            lambda: None if torch.equal(output.long(), logits.argmax(dim=-1)) else
            Finding("with temperature 0 every row must give its argmax", FailureKind.MISMATCH),
        )
    # What the draws fail is a property of every right sampler (repeatable, independent, distributed as the
    # filtered softmax), typed as such unless a step said more (a tensor of the wrong shape or dtype).
    return finding(first_problem(lambda: _draws_problem(output, logits[0], kwargs),
                                 lambda: _distribution_problem(output[0].long(), logits[0], kwargs)),
                   FailureKind.PROPERTY)


# --- part 5: one cached generation step ---------------------------------------------------------------------
def _step_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, past: int, d: int) -> Case:
        x = randn(g, batch, past + 1, d)
        w_q, w_k, w_v = (randn(g, d, d, scale=d ** -0.5) for _ in range(3))
        past_k = None if past == 0 else x[:, :past] @ w_k
        past_v = None if past == 0 else x[:, :past] @ w_v
        # One key (an empty cache): the weight is 1 whatever the scores, so a step without the scale, or one that
        # skips the new token, passes: it must pass, but earns nothing on its own.
        return Case(name, (x[:, past:], w_q, w_k, w_v, past_k, past_v), data={"x": x}, credit=past > 0)

    return [
        case("the first token: empty cache (None)", 2, 0, 8),
        case("4 cached positions, batch 2, d = 8", 2, 4, 8),
        case("9 cached positions, batch 1, d = 16", 1, 9, 16),
        case("1 cached position, batch 3, d = 4", 3, 1, 4),
    ]


def _whole_sequence(v: View, past: bool = False, scaled: bool = True) -> tuple[torch.Tensor, ...] | None:
    """(output (B, 1, d), keys, values) of the last position attending to the whole sequence in float64; with
    ``past``, to the cached positions only (``None`` without any); unscaled scores without ``scaled``."""
    x = f64(v.data["x"])
    queries, keys, values = (x @ w for w in v.x[1:4])
    length = x.size(1) - 1 if past else x.size(1)
    if length == 0:
        return None
    scores = queries[:, -1:] @ keys[:, :length].transpose(-2, -1) / (math.sqrt(x.size(-1)) if scaled else 1.0)
    return torch.softmax(scores, dim=-1) @ values[:, :length], keys, values


_STEP = Check(
    reference=_whole_sequence,
    outputs=(Out("output", "attention over the whole sequence"), Out("keys", "the cached keys followed by the new one"),
             Out("values", "the cached values followed by the new one")),
    compare=("keys", "values", "output"),
    mistakes=(Mistake(lambda v: (_whole_sequence(v, past=True) or (None,))[0],
                      "your new token does not attend to itself: append its key and value before attending"),
              Mistake(lambda v: _whole_sequence(v, scaled=False)[0], "divide the scores by sqrt(d)")),
)


# --- part 6: RMSNorm (chapter 13b) ------------------------------------------------------------------------
def _rms_norm_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, x: torch.Tensor, eps: float = 1e-5, **data: Any) -> Case:
        weight = (1.0 + randn(g, x.size(-1), scale=0.5)).to(x.dtype)  # far from ones: a missing weight shows
        return Case(name, (x, weight), {"eps": eps}, data=data)

    width = int(torch.randint(5, 41, (1,), generator=g))  # a feature size no code can assume
    wrong_weight = Case("a weight of 7 gains for 6 features raises a ValueError",
                        (randn(g, 2, 6), randn(g, 7)), {"eps": 1e-5}, data={"error": True})
    return [
        case("x (4, 10) with a random weight", randn(g, 4, 10)),
        case("a batch of sequences, x (2, 5, 16)", randn(g, 2, 5, 16, scale=3.0)),
        case("inputs far from zero: mean about 4, x (3, 7, 12)", 4.0 + randn(g, 3, 7, 12)),
        case("small entries (about 1e-3, where eps matters), x (2, 3, 32)", randn(g, 2, 3, 32, scale=1e-3)),
        case("eps = 0.1, x (2, 6, 6)", randn(g, 2, 6, 6, scale=0.5), eps=0.1),
        case("a feature size drawn between 5 and 40, x (3, 4, d)", randn(g, 3, 4, width)),
        case("float64 input keeps its dtype, x (2, 2, 3, 9)", randn(g, 2, 2, 3, 9, dtype=torch.float64)),
        case("float16 input with entries near 300 (their squares overflow float16), x (2, 3, 8)",
             randn(g, 2, 3, 8, scale=300.0).half(), half=True),
        wrong_weight,
    ]


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float, dim: int | None = -1, centre: bool = False,
         eps_inside: bool = True) -> torch.Tensor:
    """RMSNorm and its usual wrong variants, in float64 (``dim=None``: one mean square over all the elements)."""
    if centre:
        x = x - x.mean(dim=-1, keepdim=True)
    mean_square = x.pow(2).mean() if dim is None else x.pow(2).mean(dim=dim, keepdim=True)
    scale = (mean_square + eps).sqrt() if eps_inside else mean_square.sqrt() + eps
    return x / scale * (1.0 if weight is None else weight)


_RMS_NORM_MISTAKES = (  # (x, weight, eps), float64 -> a wrong RMSNorm
    Mistake(lambda x, w, eps: _rms(x, w, eps, eps_inside=False),
            "your output matches x / (sqrt(mean(x^2)) + eps): eps belongs inside the square root, "
            "x / sqrt(mean(x^2) + eps)"),
    Mistake(lambda x, w, eps: _rms(x, w, 0.0),
            "your output matches an RMSNorm without eps: add eps to the mean square, inside the square root"),
    Mistake(lambda x, w, eps: _rms(x, w, eps, centre=True),
            "your output matches a LayerNorm without bias: RMSNorm does not subtract the mean, it divides x "
            "itself by its root mean square"),
    Mistake(lambda x, w, eps: _rms(x, None, eps),
            "your output is normalised but ignores the weight: multiply by it, one gain per feature"),
    Mistake(lambda x, w, eps: _rms(x, w, eps, dim=None),
            "your mean square is taken over all the elements of x at once: RMSNorm takes one per token, the mean "
            "of x^2 over the last dimension (dim=-1, keepdim=True)"),
    Mistake(lambda x, w, eps: _rms(x, w, eps, dim=1) if x.dim() > 2 else None,
            "your mean square is taken over dimension 1: RMSNorm averages over the last dimension (the "
            "features of one token), whatever the number of leading dimensions"),
)


def _weight_size_error(v: View) -> tuple[tuple[int, int], str] | None:
    """What the case with a weight of the wrong size demands: a ValueError naming both sizes."""
    features, gains = v.args[0].size(-1), v.args[1].size(-1)
    why = f"the weight has {gains} gains but x has {features} features; name both sizes in the message"
    return ((features, gains), why) if v.data.get("error") else None


def _float16_overflow(v: View) -> str | None:
    if v.data.get("half") and not matches(v.got.output, v.want.output, atol=2e-3, rtol=2e-3):
        return ("your float16 output is wrong: squares of entries near 300 exceed float16's largest number "
                "(65504); compute the mean square in float32 and return float16")
    return None


_RMS_NORM = Check(
    reference=lambda v: F.rms_norm(v.x[0], (v.x[0].size(-1),), v.x[1], v.kwargs["eps"]),
    outputs=(Out("output", "F.rms_norm (nn.RMSNorm)", atol=lambda v: 2e-3 if v.data.get("half") else 1e-5,
                 rtol=lambda v: 2e-3 if v.data.get("half") else 1e-4, dtype=lambda v: v.args[0].dtype),),
    raises=_weight_size_error,
    advice=lambda v: (" (squares of entries near 300 exceed float16's largest number, 65504: compute the mean "
                      "square in float32 and return float16)") if v.data.get("half") else "",
    mistakes=mistakes_on(_RMS_NORM_MISTAKES, lambda v: (*v.x, v.kwargs["eps"])),
    explain=(_float16_overflow,),
)


class TorchRMSNormRefused(PermissionError):
    """What the learner's ``rms_norm`` gets when it calls PyTorch's own RMSNorm."""


class _RefuseTorchRMSNorm(TorchFunctionMode):
    """While active, every PyTorch function whose name holds ``rms_norm`` (``F.rms_norm``, ``nn.RMSNorm``, the
    ``aten`` operators) raises. Best effort: private ``torch._C`` API (``DisableTorchFunction()``) steps round it,
    and nothing in the worker refuses that."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if "rms_norm" in str(getattr(func, "__name__", func)):
            raise TorchRMSNormRefused("this part asks you to write RMSNorm from its formula: PyTorch's own "
                                      "(F.rms_norm, nn.RMSNorm, torch.rms_norm) does not run here")
        return func(*args, **(kwargs or {}))


def _run_rms_norm(obj: Any, case: Case) -> Any:
    """Call the learner's ``rms_norm`` with PyTorch's RMSNorm refused (the answer must be the learner's)."""
    with _RefuseTorchRMSNorm():
        return call_expecting_error(obj, case)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex13.toml
    id="ex13", chapters=("13_decoder_only_language_models", "13b_modern_block_and_checkpoints"), preamble=PREAMBLE,
    parts=(
        Part("next_token_loss", points=2, make_cases=_loss_cases, verify=_LOSS),
        Part("top_k_filter", points=1, make_cases=_top_k_cases, verify=_TOP_K),
        Part("top_p_filter", points=2, make_cases=_top_p_cases, verify=_TOP_P),
        Part("sample_next_token", points=2, make_cases=_sample_cases, verify=_verify_sample, run=_run_sample),
        Part("cached_attention_step", points=2, make_cases=_step_cases, verify=_STEP),
        Part("rms_norm", points=2, make_cases=_rms_norm_cases, verify=_RMS_NORM, run=_run_rms_norm),
    ),
))
