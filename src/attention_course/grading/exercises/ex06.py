"""Exercise 06, multi-head attention: the checks behind ``exercises/ex06_multi_head_attention.ipynb``.

The learner splits heads and merges them, writes the forward pass from a dict ``W_q, b_q, ..., W_o, b_o`` (row
convention, True = may attend), reads those out of ``nn.MultiheadAttention`` and reproduces that module (True =
blocked masks). References: float64 ``nn.MultiheadAttention``, or ``ac.MultiHeadAttention`` where PyTorch gives
NaN. Recognised: scrambled heads, merging without the transpose, 1/√d_model, no output projection, averaged
weights, inverted masks, values projected from the key, untransposed or reordered ``in_proj_weight`` blocks.
"""

from __future__ import annotations

import math
from itertools import product
from typing import Any

import torch
from torch import nn

from attention_course.grading.compare import (
    close_problem,
    f64,
    finite_problem,
    matches,
    rows_sum_problem,
    tensor_problem,
)
from attention_course.grading.declare import Check, Out, View, distribution, mistakes_on, second_run
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_expecting_error,
    degenerate,
    preamble,
    randn,
    with_texts,
)

# The references run in the grader's process only: the sandbox's view of the package lacks them.
MultiHeadAttention = instructor_side("attention_course.multihead", "MultiHeadAttention")

PREAMBLE = preamble(nn=True)

PARAM_NAMES = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")


# --- part 1: split heads -------------------------------------------------------------------------------
def _split_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("x (2, 5, 12), 3 heads of 4", (randn(g, 2, 5, 12), 3)),
        Case("x (1, 4, 8), 2 heads of 4", (randn(g, 1, 4, 8), 2)),
        degenerate(Case("one head: x (3, 6, 5), 1 head of 5", (randn(g, 3, 6, 5), 1))),
        Case("one feature per head: x (2, 3, 4), 4 heads of 1", (randn(g, 2, 3, 4), 4)),
        Case("d_model = 10, 4 heads: must raise ValueError naming 10 and 4", (randn(g, 2, 3, 10), 4),
             data={"error": True}),
    ]


def _expected_split(x: torch.Tensor, h: int) -> torch.Tensor:
    B, L, d = x.shape
    return x.reshape(B, L, h, d // h).transpose(1, 2)


_SPLIT_MISTAKES = (  # (x (B, L, d), h) -> a wrong split, or None where it cannot be told apart
    Mistake(lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1) if h > 1 and x.shape[1] > 1 else None,
            "your split reshapes straight to (B, h, L, d_head), which scrambles heads and positions "
            "(head 0 gets pieces of the first tokens only); reshape to (B, L, h, d_head) first, then "
            "swap dimensions 1 and 2"),
    Mistake(lambda x, h: x.reshape(*x.shape[:2], -1, h).permute(0, 3, 1, 2) if h > 1 and x.shape[2] // h > 1
            else None,
            "your head 0 holds features 0, h, 2h, ...: split the last dimension as (h, d_head), so that "
            "head i gets the consecutive features i*d_head .. (i+1)*d_head - 1"),
)


def _head_blocks(v: View) -> str | None:
    x, h = v.args
    d_head = x.shape[-1] // h
    for i in range(h):
        if not torch.allclose(f64(v.got.split[:, i]), f64(x[:, :, i * d_head:(i + 1) * d_head]), atol=1e-6):
            return (f"head {i} of your output should be features {i * d_head}..{(i + 1) * d_head - 1} of every "
                    "token, x[:, :, i*d_head:(i+1)*d_head]")
    return None


_SPLIT = Check(
    reference=lambda v: _expected_split(*v.x),
    outputs=(Out("split", "x viewed as (B, L, h, d_head) with dimensions 1 and 2 swapped"),),
    raises=lambda v: ((v.args[0].shape[-1], v.args[1]), f"d_model = {v.args[0].shape[-1]} is not divisible by "
                      f"num_heads = {v.args[1]}") if v.data.get("error") else None,
    mistakes=mistakes_on(_SPLIT_MISTAKES, lambda v: v.args, on="split"),
    explain=(_head_blocks,),
)


# --- part 2: merge heads -------------------------------------------------------------------------------
def _merge_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("x (2, 3, 5, 4): 3 heads of 4 -> (2, 5, 12)", (randn(g, 2, 3, 5, 4),)),
        Case("x (1, 2, 6, 8)", (randn(g, 1, 2, 6, 8),)),
        degenerate(Case("one head: x (2, 1, 4, 6)", (randn(g, 2, 1, 4, 6),))),
        Case("x (3, 4, 7, 1): heads of one feature", (randn(g, 3, 4, 7, 1),)),
        Case("as many heads as tokens: x (2, 5, 5, 3)", (randn(g, 2, 5, 5, 3),)),
    ]


def _straight_merge(v: View) -> torch.Tensor | None:
    B, h, L, d_head = v.x[0].shape
    return v.x[0].reshape(B, L, h * d_head) if h > 1 and L > 1 else None


_MERGE = Check(
    reference=lambda v: v.x[0].transpose(1, 2).reshape(v.x[0].shape[0], v.x[0].shape[2], -1),
    outputs=(Out("merged tensor", "the heads side by side along the features, (B, L, h*d_head)"),),
    mistakes=(Mistake(_straight_merge, "your merge reshapes (B, h, L, d_head) straight to (B, L, h*d_head), mixing "
                      "positions of different heads; swap dimensions 1 and 2 to (B, L, h, d_head) first, then reshape",
                      on="merged tensor"),),
)


# --- part 3: the multi-head forward pass ---------------------------------------------------------------
def _forward_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, B: int, Lq: int, Lk: int, d: int, h: int, mask: torch.Tensor | None = None,
             self_attention: bool = False, same_kv: bool = True, scale: float = 1.0, gradient: bool = False) -> Case:
        query = randn(g, B, Lq, d, scale=scale)
        key = query.clone() if self_attention else randn(g, B, Lk, d, scale=scale)
        value = key.clone() if same_kv else randn(g, B, Lk, d)
        params = {f"{kind}_{n}": randn(g, d, d, scale=d ** -0.5) if kind == "W" else randn(g, d, scale=0.1)
                  for n in "qkvo" for kind in "Wb"}  # W_q, b_q, W_k, ...
        return Case(name, (query, key, value, params, h), {"mask": mask}, {"gradient": True} if gradient else {})

    lengths = torch.tensor([6, 3])
    padding = (torch.arange(6) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    no_key = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    no_key[1, 0, 2] = False  # query 2 of batch item 1 may attend to nothing
    return [
        case("self-attention: x (2, 5, 12), 3 heads", 2, 5, 5, 12, 3, self_attention=True),
        case("cross-attention: 4 queries, 7 keys, d_model = 8, 2 heads", 2, 4, 7, 8, 2),
        case("key and value are different tensors", 1, 3, 6, 8, 4, same_kv=False),
        case("d_model = 64, 8 heads: each head is scaled by 1/sqrt(8), not 1/sqrt(64)", 1, 4, 6, 64, 8, scale=3.0),
        degenerate(case("one head: plain attention with projections", 2, 3, 4, 6, 1)),
        case("padding mask (B, 1, 1, Lk): item 1 has 3 real keys of 6", 2, 4, 6, 8, 2, mask=padding),
        case("causal mask (L, L), self-attention", 2, 5, 5, 8, 2, mask=causal, self_attention=True),
        case("a query with no allowed key: zero weights, output = b_o, no NaN (also in the gradient)", 2, 4, 5, 8, 2,
             mask=no_key, gradient=True),
    ]


def _run_forward(obj: Any, case: Case) -> Any:
    """Call the learner's function; for the gradient case return (its result, d(sum of outputs)/d(query))."""
    args, kwargs = case.fresh_args()
    if not case.data.get("gradient"):
        return obj(*args, **kwargs)
    query = args[0].clone().requires_grad_(True)
    result = obj(query, *args[1:], **kwargs)
    grad = None
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.Tensor) \
            and result[0].requires_grad:
        (grad,) = torch.autograd.grad(result[0].sum(), query, allow_unused=True)
    return result, grad


def _torch_module(params: dict[str, torch.Tensor], h: int) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention (float64, batch-first) holding ``params`` (row convention)."""
    module = nn.MultiheadAttention(params["W_q"].shape[0], h, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([f64(params[f"W_{n}"]).T for n in "qkv"]))
        module.in_proj_bias.copy_(torch.cat([f64(params[f"b_{n}"]) for n in "qkv"]))
        module.out_proj.weight.copy_(f64(params["W_o"]).T)
        module.out_proj.bias.copy_(f64(params["b_o"]))
    return module.eval()


def _library_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, module: nn.MultiheadAttention,
                     mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The library's (output, weights) for ``module``'s weights with a course mask (True = may attend), float64."""
    library = MultiHeadAttention.from_torch(module.to(torch.float64)).eval()
    with torch.no_grad():
        return library(f64(query), f64(key), f64(value), mask=mask)


def _forward_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, weights (B, h, Lq, Lk)) in float64, naming the reference in ``v.label``."""
    query, key, value, params, h = v.args
    mask, module = v.kwargs["mask"], _torch_module(params, h)
    allowed = None if mask is None else mask.expand(query.shape[0], h, query.shape[1], key.shape[1])
    if allowed is not None and not bool(allowed.any(dim=-1).all()):
        # PyTorch gives NaN for a query with no allowed key; the library gives zero weights (course convention).
        v.label = "ac.MultiHeadAttention"
        return _library_forward(query, key, value, module, mask)
    v.label = "nn.MultiheadAttention"
    attn_mask = None if mask is None else ~allowed.flatten(0, 1)  # (B * h, Lq, Lk), True = blocked
    with torch.no_grad():
        return module(f64(query), f64(key), f64(value), attn_mask=attn_mask, average_attn_weights=False)


def _manual_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, params: dict[str, torch.Tensor],
                    h: int, scale: float, project_output: bool = True) -> torch.Tensor:
    """Unmasked multi-head attention with a chosen scale, for recognising wrong answers."""
    p = {name: f64(t) for name, t in params.items()}
    q, k, v = (_expected_split(f64(x) @ p[f"W_{n}"] + p[f"b_{n}"], h) for x, n in zip((query, key, value), "qkv"))
    weights = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
    B, _, Lq, d_head = q.shape
    merged = (weights @ v).transpose(1, 2).reshape(B, Lq, h * d_head)
    return merged @ p["W_o"] + p["b_o"] if project_output else merged


# (query, key, value, params, h, mask) -> a wrong output, or None where it cannot be told apart
_FORWARD_MISTAKES = (
    Mistake(lambda q, k, v, p, h, mask: _manual_forward(q, k, v, p, h, 1 / math.sqrt(q.shape[-1]))
            if mask is None and h > 1 else None,
            lambda q, k, v, p, h, mask: f"your scores are divided by sqrt(d_model) = sqrt({q.shape[-1]}); each "
            f"head's scores are dot products of d_head = {q.shape[-1] // h} features, so divide by sqrt(d_head) = "
            f"sqrt({q.shape[-1] // h})"),
    Mistake(lambda q, k, v, p, h, mask: _manual_forward(q, k, v, p, h, 1 / math.sqrt(q.shape[-1] // h),
                                                        project_output=False) if mask is None else None,
            "your output is the concatenated heads; finish with the output projection: @ W_o + b_o"),
    Mistake(lambda q, k, v, p, h, mask: None if mask is None or bool(mask.all()) else
            _library_forward(q, k, v, _torch_module(p, h), ~mask)[0],
            "you blocked the keys where the mask is True; in this course True means \"may attend\""),
    Mistake(lambda q, k, v, p, h, mask: _library_forward(q, k, k, _torch_module(p, h), mask)[0],
            "your values are projected from key: project them from value (value @ W_v + b_v); key only gives the "
            "keys the queries are scored against"),
)


def _no_key(v: View) -> torch.Tensor | None:
    """(B, h, Lq): the queries with no allowed key (``None`` without a mask)."""
    mask = v.kwargs["mask"]
    return None if mask is None else ~mask.expand(v.want.weights.shape).any(dim=-1)


def _averaged_heads(v: View, h: int, advice: str) -> str | None:
    """Weights (B, Lq, Lk) averaged over the heads; ``advice`` ends the message, given the shape wanted."""
    weights = v.output[1] if isinstance(v.output, (tuple, list)) and len(v.output) == 2 else None
    B, Lq, Lk = v.args[0].shape[0], v.args[0].shape[1], v.args[1].shape[1]
    if isinstance(weights, torch.Tensor) and tuple(weights.shape) == (B, Lq, Lk) and h > 1:
        return (f"your weights have shape {tuple(weights.shape)}: return one map per head"
                + advice.format(tuple(v.want.weights.shape)))
    return None


def _empty_rows(v: View) -> str | None:
    no_key, weights, out = _no_key(v), v.got.weights, v.got.output
    if no_key is None or not bool(no_key.any()):
        return None
    b, head, q = (int(i) for i in no_key.nonzero()[0])
    if not torch.isfinite(weights[b, head, q]).all() or not torch.isfinite(out[b, q]).all():
        return Finding(f"query {q} of batch item {b} has no allowed key and your result there contains NaN; give "
                       "such a row zero weights (fill blocked scores with a large negative finite number, or zero "
                       "the row after the softmax)", FailureKind.NOT_FINITE)
    if not torch.allclose(f64(weights[b, head, q]), torch.zeros(weights.shape[-1], dtype=torch.float64)):
        return (f"query {q} of batch item {b} has no allowed key, so its weights must be all zero, got "
                f"{[round(float(w), 3) for w in weights[b, head, q]]}")
    return None


def _gradient(v: View) -> str | None:
    if not v.data.get("gradient"):
        return None
    if not isinstance(v.extra, torch.Tensor) or tuple(v.extra.shape) != tuple(v.args[0].shape):
        return "could not compute the gradient of your output with respect to the query"
    if not bool(torch.isfinite(v.extra).all()):
        return Finding("the gradient of your output with respect to the query contains NaN for the query with no "
                       "allowed key: -inf scores make softmax compute 0/0 in the backward pass too; fill blocked "
                       "scores with a large negative finite number (the most negative one of their dtype, see "
                       "torch.finfo)",
                       FailureKind.NOT_FINITE)
    return None


_FORWARD = Check(
    reference=_forward_reference,
    # The output passes through four float32 projections of width d_model: 1e-4 absorbs their rounding.
    # Finiteness is a property here, so that a NaN in a row with no allowed key gets _empty_rows' message first.
    outputs=(Out("output", lambda v: v.label, atol=1e-4, finite=False),
             Out("weights", lambda v: f"the per-head weights of {v.label}", finite=False)),
    compare=("weights",),
    unpack=second_run("gradient"),
    before=(lambda v: _averaged_heads(v, v.args[4], ", shape {}, not their average"),),
    properties=(_empty_rows, lambda v: finite_problem(v.got.weights, "your weights"),
                lambda v: finite_problem(v.got.output, "your output"), distribution("weights", skip=_no_key),
                _gradient),
    mistakes=mistakes_on(_FORWARD_MISTAKES, lambda v: (*v.args, v.kwargs["mask"]), on="output"),
)


# --- part 4: parameters from nn.MultiheadAttention ----------------------------------------------------
def _module_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, d: int, h: int, bias: bool = True) -> Case:
        module = nn.MultiheadAttention(d, h, bias=bias, batch_first=True, device="meta")  # shapes only, no RNG
        state = {key: randn(g, *value.shape, scale=0.3) for key, value in module.state_dict().items()}
        # The weights travel as the case's arguments; run() loads them into a module for the learner.
        return Case(name, tuple(state.values()), data={"d_model": d, "num_heads": h, "bias": bias,
                                                       "names": list(state), "x": randn(g, 2, 4, d)})

    return [
        case("d_model = 8, 2 heads", 8, 2),
        case("d_model = 12, 3 heads", 12, 3),
        case("one head, d_model = 6", 6, 1),
        case("bias=False: the biases are zero vectors", 8, 4, bias=False),
    ]


def _build_module(case: Case) -> nn.MultiheadAttention:
    """The case's module: its state dict is in case.data for part 5, in the case's arguments for part 4."""
    data = case.data
    module = nn.MultiheadAttention(data["d_model"], data["num_heads"], bias=data["bias"], batch_first=True)
    module.load_state_dict(data["state"] if "state" in data else dict(zip(data["names"], case.args)))
    return module.eval()


def _expected_params(case: Case) -> dict[str, torch.Tensor]:
    state = dict(zip(case.data["names"], case.args))
    weights = (*state["in_proj_weight"].chunk(3, dim=0), state["out_proj.weight"])  # each (d, d) in (out, in) layout
    zeros = torch.zeros(case.data["d_model"])
    biases = (*state["in_proj_bias"].chunk(3), state["out_proj.bias"]) if case.data["bias"] else (zeros,) * 4
    return {**{f"W_{n}": w.T for n, w in zip("qkvo", weights)}, **{f"b_{n}": b for n, b in zip("qkvo", biases)}}


def _param_mistake(name: str, actual: torch.Tensor, expected: dict[str, torch.Tensor]) -> Finding | None:
    """The known mistake the learner's ``name`` shows: a weight left in (out, in) layout, or another block."""
    if name.startswith("W_") and matches(actual, expected[name].T):
        return Finding(f"your {name} is the transpose of what the row convention needs: PyTorch stores Linear-style "
                       "weights as (out, in), so W = block.T (Q = X @ W_q)", FailureKind.KNOWN_MISTAKE)
    for other in PARAM_NAMES:
        if other != name and other[0] == name[0] and matches(actual, expected[other]):
            if "o" in (name[-1], other[-1]):  # the output projection is a module of its own
                where = "W_o and b_o come from out_proj (weight and bias), the others from the in_proj tensors"
            else:
                stacked, pieces = ("in_proj_weight", "rows") if name[0] == "W" else ("in_proj_bias", "entries")
                where = (f"{stacked} stacks the query, key and value blocks in the order q, k, v ({pieces} 0..d-1, "
                         "d..2d-1, 2d..3d-1)")
            return Finding(f"your {name} holds {other}: {where}", FailureKind.KNOWN_MISTAKE)
    return None


def _verify_params(case: Case, output: Any) -> Finding | None:
    if not isinstance(output, dict):
        return Finding(f"expected a dict with the keys {', '.join(PARAM_NAMES)}, got {type(output).__name__}",
                       FailureKind.TYPE)
    missing = [name for name in PARAM_NAMES if name not in output]
    if missing:
        return Finding(f"your dict is missing the keys {missing}; expected {', '.join(PARAM_NAMES)}", FailureKind.TYPE)
    expected = _expected_params(case)
    for name in PARAM_NAMES:
        actual, want = output[name], expected[name]
        problem = tensor_problem(actual, f"your {name}", want.shape)
        if problem:
            no_bias = name.startswith("b_") and not case.data["bias"]
            return problem + " (the module has no biases: return zero vectors of length d_model)" if no_bias \
                else problem
        if not matches(actual, want):
            return _param_mistake(name, actual, expected) or close_problem(
                actual, want, f"your {name}", f"the {name} of ac.MultiHeadAttention.from_torch(module)")
    # Everything matches: confirm the parameters reproduce the module itself.
    x, h = case.data["x"], case.data["num_heads"]
    with torch.no_grad():
        reference, _ = _build_module(case)(x, x, x, need_weights=False)
    mine = _manual_forward(x, x, x, output, h, 1 / math.sqrt(case.data["d_model"] // h))
    return close_problem(mine, reference, "multi-head attention with your parameters", "module(x, x, x)")


# --- part 5: reproduce nn.MultiheadAttention, masks included ------------------------------------------
def _torch_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, d: int, h: int, Lq: int, Lk: int, key_padding: torch.Tensor | None = None,
             attn_mask: torch.Tensor | None = None, self_attention: bool = False) -> Case:
        module = nn.MultiheadAttention(d, h, batch_first=True, device="meta")  # shapes only, no RNG
        state = {key: randn(g, *value.shape, scale=0.3) for key, value in module.state_dict().items()}
        query = randn(g, 2, Lq, d)
        key = query.clone() if self_attention else randn(g, 2, Lk, d)
        return Case(name, (query, key, key.clone()), {"key_padding_mask": key_padding, "attn_mask": attn_mask},
                    {"d_model": d, "num_heads": h, "bias": True, "state": state})

    padding = torch.tensor([[False] * 6, [False, False, False, True, True, True]])  # True = padding (blocked)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)  # True above the diagonal: blocked
    return [
        degenerate(case("no masks: self-attention, d_model = 8, 2 heads", 8, 2, 5, 5, self_attention=True)),
        case("cross-attention, 4 queries and 6 keys, 4 heads", 8, 4, 4, 6),
        case("key_padding_mask (B, Lk), True = padding", 12, 3, 4, 6, key_padding=padding),
        case("attn_mask (L, L), True above the diagonal (causal)", 8, 2, 5, 5, attn_mask=future, self_attention=True),
        case("both masks at once", 8, 2, 5, 6, key_padding=padding,
             attn_mask=torch.tensor([[False, False, True, False, False, False]]).expand(5, 6).clone()),
    ]


def _run_torch(obj: Any, case: Case) -> Any:
    args, kwargs = case.fresh_args()
    return obj(_build_module(case), *args, **kwargs)


def _torch_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    module = _build_module(v.case).to(torch.float64)
    with torch.no_grad():
        return module(*v.x, key_padding_mask=v.kwargs["key_padding_mask"], attn_mask=v.kwargs["attn_mask"],
                      average_attn_weights=False)


def _inverted(v: View) -> str | None:
    """Which of PyTorch's masks (True = blocked) the learner used as a course mask (True = may attend)."""
    names = [name for name in ("key_padding_mask", "attn_mask") if v.kwargs[name] is not None]
    for flips in product((False, True), repeat=len(names)):
        if not any(flips):
            continue
        allowed = torch.ones((), dtype=torch.bool)
        for name, flip in zip(names, flips):
            blocked = v.kwargs[name][:, None, None, :] if name == "key_padding_mask" else v.kwargs[name]
            allowed = allowed & (blocked if flip else ~blocked)
        if matches(v.got.output, _library_forward(*v.args, _build_module(v.case), allowed)[0]):
            flipped = " and ".join(name for name, flip in zip(names, flips) if flip)
            return Finding(f"you used {flipped} without inverting it: nn.MultiheadAttention's masks mean True = "
                           "blocked, the course's True = may attend; convert with ~mask", FailureKind.KNOWN_MISTAKE)
    return None


_TORCH = Check(
    reference=_torch_reference,
    outputs=(Out("output", "module(query, key, value, masks)"),
             Out("weights", "module(..., average_attn_weights=False)")),
    compare=("weights",),
    before=(lambda v: _averaged_heads(v, v.data["num_heads"], " {} (PyTorch's average_attn_weights=False)"),),
    properties=(_inverted, lambda v: rows_sum_problem(v.got.weights)),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex06.toml
    id="ex06", chapters=("06_multi_head_attention",), preamble=PREAMBLE,
    parts=(
        Part("split_heads", points=1, make_cases=_split_cases, verify=_SPLIT, run=call_expecting_error),
        Part("merge_heads", points=1, make_cases=_merge_cases, verify=_MERGE),
        Part("multi_head_attention", points=3, make_cases=_forward_cases, verify=_FORWARD, run=_run_forward),
        Part("params_from_torch", points=2, make_cases=_module_cases, verify=_verify_params,
             run=lambda obj, case: obj(_build_module(case))),
        Part("attention_like_torch", points=2, make_cases=_torch_cases, verify=_TORCH, run=_run_torch),
    ),
))
