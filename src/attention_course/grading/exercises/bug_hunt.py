"""The bug hunt: the checks behind ``exercises/ex_bug_hunt.ipynb``.

Each part hands the learner a broken function, modelled on a bug popular tutorials shipped (errata number in
its summary). The fix is checked against PyTorch (``nn.MultiheadAttention``, ``F.layer_norm``,
``F.scaled_dot_product_attention``) and properties: other key lengths, finite fully masked rows, no causal
leakage, dropout statistics.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.grading.compare import (
    close_problem,
    f64,
    finite_problem,
    float32_atol,
    fmt,
    row_name,
    tensor_problem,
)
from attention_course.grading.declare import Check, Out, View, distribution, second_run
from attention_course.grading.exercises.ex08 import run_dropout, verify_dropout  # the same dropout contract
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.spec import Case, Exercise, Mistake, Part, call_function, preamble, randn, with_texts

PREAMBLE = preamble(nn=True)


def _projections(g: torch.Generator, d_model: int, count: int = 4) -> tuple[torch.Tensor, ...]:
    """``count`` (d_model, d_model) weights in row convention (x @ w), scaled to keep activations near unit size."""
    return tuple(randn(g, d_model, d_model, scale=1.0 / math.sqrt(d_model)) for _ in range(count))


def _torch_mha(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, w_q: torch.Tensor,
               w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor, num_heads: int) -> torch.Tensor:
    """nn.MultiheadAttention (no biases, float64) with the given row-convention weights: (B, Lq, D)."""
    d_model = query.shape[-1]
    module = nn.MultiheadAttention(d_model, num_heads, bias=False, batch_first=True).double()
    with torch.no_grad():
        # nn.Linear computes x @ weightᵀ, so a row-convention weight w goes in transposed.
        module.in_proj_weight.copy_(torch.cat([w_q.T, w_k.T, w_v.T]).double())
        module.out_proj.weight.copy_(w_o.T.double())
        output, _ = module(query.double(), key.double(), value.double(), need_weights=False)
    return output


def _mha_case(g: torch.Generator, name: str, batch: int, len_q: int, len_k: int, d_model: int, heads: int) -> Case:
    query = randn(g, batch, len_q, d_model)
    key, value = (randn(g, batch, len_k, d_model) for _ in range(2))
    return Case(name, (query, key, value, *_projections(g, d_model), heads))


# --- 1: keys and values reshaped with the query length (errata 0.13) ----------------------------------
def _cross_cases(g: torch.Generator) -> list[Case]:
    return [
        _mha_case(g, "self-attention shapes: Lq = Lk = 6, d_model 16, 4 heads", 2, 6, 6, 16, 4),
        _mha_case(g, "cross-attention with Lq = 5, Lk = 7 (d_model 16, 4 heads)", 2, 5, 7, 16, 4),
        _mha_case(g, "cross-attention with Lq = 4, Lk = 2 (d_model 8, 2 heads)", 3, 4, 2, 8, 2),
        _mha_case(g, "cross-attention with Lq = 1, Lk = 9 (d_model 12, 3 heads)", 1, 1, 9, 12, 3),
    ]


_AGAINST_MHA = Check(reference=lambda v: _torch_mha(*v.args),
                     outputs=(Out("output", "nn.MultiheadAttention with the same weights"),))


# --- 2: heads mixed by an einsum on permuted tensors (errata 2.4) -------------------------------------
def _head_weight_cases(g: torch.Generator) -> list[Case]:
    shapes = [  # name, batch, Lq, Lk, d_model, heads
        ("Lq = Lk = 5, d_model 16, 4 heads", 2, 5, 5, 16, 4),
        ("Lq = Lk = 3, d_model 12, 2 heads", 1, 3, 3, 12, 2),
        ("cross-attention Lq = 3, Lk = 6, d_model 8, 2 heads", 2, 3, 6, 8, 2),
        ("one head: Lq = Lk = 4, d_model 6", 2, 4, 4, 6, 1),
    ]
    return [Case(name, (randn(g, batch, len_q, d_model), randn(g, batch, len_k, d_model), heads))
            for name, batch, len_q, len_k, d_model, heads in shapes]


def _head_weights_reference(v: View) -> torch.Tensor:
    q, k, heads = v.x
    d_head = q.shape[-1] // heads
    q_heads, k_heads = (t.unflatten(-1, (heads, d_head)).transpose(1, 2) for t in (q, k))  # (B, H, L, d_head)
    return torch.softmax(q_heads @ k_heads.transpose(-2, -1) / math.sqrt(d_head), dim=-1)


def _heads_after_queries(v: View) -> Finding | None:
    """Weights laid out (B, Lq, H, Lk), the right maps with the head and query axes swapped."""
    want, out = v.want.weights, v.output
    B, H, Lq, Lk = want.shape
    if isinstance(out, torch.Tensor) and out.is_floating_point() and H != Lq and tuple(out.shape) == (B, Lq, H, Lk) \
            and torch.allclose(f64(out), want.transpose(1, 2), atol=1e-5, rtol=1e-4):
        return Finding(f"your weights are laid out (batch, query, head, key), shape {tuple(out.shape)}: put the "
                       f"head axis before the query axis, (batch, head, query, key), shape {tuple(want.shape)} (in an "
                       "einsum, the order of the output labels sets the layout)", FailureKind.KNOWN_MISTAKE)
    return None


_HEAD_WEIGHTS = Check(reference=_head_weights_reference, properties=(distribution("weights"),),
                      before=(_heads_after_queries,),
                      outputs=(Out("weights", "each head's softmax(q_h k_hᵀ / √d_head)"),))


# --- 3: scaled by √d_model instead of √d_head (errata 2.6) -------------------------------------------
def _self_mha_cases(g: torch.Generator) -> list[Case]:
    shapes = [  # name, batch, L, d_model, heads
        ("d_model 16, 4 heads, L = 5", 2, 5, 16, 4),
        ("d_model 64, 8 heads, L = 6", 1, 6, 64, 8),
        ("d_model 8, 1 head, L = 4", 2, 4, 8, 1),
    ]
    return [Case(name, (randn(g, batch, length, d_model, scale=2.0), *_projections(g, d_model), heads))
            for name, batch, length, d_model, heads in shapes]


def _scaled_by_d_head(v: View) -> torch.Tensor:
    """Attention whose scores are divided by d_head instead of its square root (the queries shrunk to match)."""
    x, w_q, w_k, w_v, w_o, heads = v.args
    return _torch_mha(x, x, x, w_q / math.sqrt(x.shape[-1] // heads), w_k, w_v, w_o, heads)


_SELF_MHA = Check(reference=lambda v: _torch_mha(v.args[0], v.args[0], *v.args),
                  outputs=(Out("output", "nn.MultiheadAttention with the same weights"),),
                  mistakes=(Mistake(_scaled_by_d_head, "your scores are divided by d_head: scaled dot-product "
                                                       "attention divides them by its square root, sqrt(d_head)"),))


# --- 4: -inf masking gives NaN on fully masked rows (errata 0.9) --------------------------------------
def _masked_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, mask: torch.Tensor, batch: int = 2, d: int = 4, d_v: int = 3) -> Case:
        len_q, len_k = mask.shape[-2:]
        return Case(name, (randn(g, batch, len_q, d), randn(g, batch, len_k, d), randn(g, batch, len_k, d_v),
                           mask))

    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    padding = torch.ones(2, 4, 6, dtype=torch.bool)
    padding[1, :, 4:] = False  # the second sequence has two padding keys
    fully = torch.ones(2, 4, 5, dtype=torch.bool)
    fully[0, 2] = False  # query 2 of batch item 0 may attend to nothing
    fully[1, 0] = False
    everything = torch.zeros(3, 4, dtype=torch.bool)
    return [
        case("a causal mask, L = 5", causal),
        case("a padding mask (last 2 keys of item 1 masked)", padding),
        case("fully masked rows (a query with no allowed key)", fully),
        case("every key masked for every query", everything),
    ]


def _masked_reference(v: View) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, values, mask = v.x
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~mask.expand(scores.shape), float("-inf")), dim=-1).nan_to_num(0.0)
    return weights @ values, weights


def _empty_rows(v: View) -> torch.Tensor:
    return ~v.args[3].expand(v.want.weights.shape).any(dim=-1)  # (B, Lq): queries with no allowed key


def _fully_masked(v: View) -> str | None:
    pairs, empty = ((v.got.weights, "weights"), (v.got.output, "output")), _empty_rows(v)
    for tensor, what in pairs:
        bad = ~torch.isfinite(tensor).all(dim=-1) & empty
        if bad.any():
            return Finding(f"fully masked {row_name(bad.nonzero()[0].tolist())} gives NaN in your {what}: a query "
                           "with no allowed key must get zero weights and zero output", FailureKind.NOT_FINITE)
    for tensor, what in pairs:
        bad = (tensor.abs().amax(dim=-1) > 1e-6) & empty
        if bad.any():
            return (f"fully masked {row_name(bad.nonzero()[0].tolist())} of your {what} is not zero: a query with "
                    "no allowed key gets zero weights and zero output")
    return None


def _masked_keys(v: View) -> str | None:
    leak = (f64(v.got.weights).abs() > 1e-6) & ~v.args[3].expand(v.want.weights.shape)
    if leak.any():
        *row, key = leak.nonzero()[0].tolist()
        return (f"{row_name(row)} of your weights gives weight to key {key}, which the mask blocks "
                "(True means 'may attend')")
    return None


_MASKED = Check(
    reference=_masked_reference,
    outputs=(Out("output", "weights @ v", finite=False), Out("weights", "the masked softmax", finite=False)),
    compare=("weights",),
    properties=(_fully_masked, lambda v: finite_problem(v.got.weights, "your weights"), _masked_keys,
                distribution("weights", skip=_empty_rows)),
)


# --- 5: summing v_i instead of v_j (errata 3.7) --------------------------------------------------------
def _loop_cases(g: torch.Generator) -> list[Case]:
    shapes = [  # name, Lq, Lk, d, d_v
        ("self-attention shapes: Lq = Lk = 4, d = 3", 4, 4, 3, 3),
        ("Lq = 3, Lk = 5, d = 4, d_v = 2", 3, 5, 4, 2),
        ("Lq = 6, Lk = 2, d = 2, d_v = 3", 6, 2, 2, 3),
    ]
    return [Case(name, (randn(g, len_q, d), randn(g, len_k, d), randn(g, len_k, d_v)))
            for name, len_q, len_k, d, d_v in shapes]


def _copies_values(v: View) -> str | None:
    rows = min(v.args[0].shape[0], v.args[2].shape[0])
    if torch.allclose(f64(v.got.output[:rows]), v.x[2][:rows], atol=1e-5):
        return Finding("your output equals the values (o_i = v_i), so attention does nothing: each output must mix "
                       "the values of all keys, weighted by its attention weights", FailureKind.KNOWN_MISTAKE)
    return None


_LOOPS = Check(reference=lambda v: torch.softmax(v.x[0] @ v.x[1].T / math.sqrt(v.x[0].shape[1]), dim=-1) @ v.x[2],
               outputs=(Out("output", "softmax(q kᵀ / √d) v", finite=False),), properties=(_copies_values,),
               mistakes=(Mistake(lambda v: v.x[2].mean(dim=0).expand(v.x[0].shape[0], -1),
                                 "every output row is the plain mean of the values: weight value j by the "
                                 "attention weight of query i on key j (the softmax of the scaled scores)"),))


# --- 6: LayerNorm dividing by σ + ε (errata 3.1) -------------------------------------------------------
def _layer_norm_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, x: torch.Tensor, eps: float = 1e-5) -> Case:
        d = x.shape[-1]
        return Case(name, (x, 1.0 + randn(g, d, scale=0.1), randn(g, d, scale=0.1)), {"eps": eps})

    return [
        case("inputs with std about 1, shape (4, 8)", randn(g, 4, 8)),
        case("inputs with std about 1e-2, shape (2, 3, 16)", 5.0 + randn(g, 2, 3, 16, scale=1e-2)),
        case("inputs with std about 1e-3, shape (3, 32)", randn(g, 3, 32, scale=1e-3)),
        case("eps = 0.1, shape (2, 6)", randn(g, 2, 6, scale=0.5), eps=0.1),
    ]


def _layer_norm_close(v: View) -> str | None:
    x, weight, bias = v.x
    eps = v.kwargs["eps"]
    # x - mean rounds to float32 at the scale of |x|, and dividing by the spread magnifies that: inputs of 5 with
    # a spread of 0.01 come out about 700 times their roundoff, so the tolerance grows with that ratio.
    spread = (x.var(dim=-1, correction=0) + eps).sqrt().min()
    atol = float32_atol(x.abs().max() / spread * weight.abs().max(), atol=1e-4)
    return close_problem(v.got.output, v.want.output, f"for inputs with std {float(x.std(dim=-1).mean()):.1g} your "
                         "output", "nn.LayerNorm (which divides by √(biased variance + eps))", atol=atol, rtol=1e-3)


def _layer_norm_variant(v: View, correction: int = 0, eps_inside: bool = True) -> torch.Tensor:
    x, weight, bias = v.x
    eps, centred = v.kwargs["eps"], x - x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, correction=correction)
    return centred / ((var + eps).sqrt() if eps_inside else var.sqrt() + eps) * weight + bias


_LAYER_NORM = Check(reference=lambda v: F.layer_norm(v.x[0], (v.x[0].shape[-1],), *v.x[1:], v.kwargs["eps"]),
                    outputs=(Out("output"),), after=(_layer_norm_close,), mistakes=(
    Mistake(lambda v: _layer_norm_variant(v, correction=1),
            "your output uses the unbiased variance (dividing by d - 1): LayerNorm divides by d, the biased "
            "variance (correction=0)"),
    Mistake(lambda v: _layer_norm_variant(v, eps_inside=False),
            "your output divides by std + eps: eps belongs inside the square root, sqrt(variance + eps)"),
))


# --- 7: dropout without rescaling (errata 3.4) ----------------------------------------------------------
def _dropout_cases(g: torch.Generator) -> list[Case]:
    def x(*shape: int) -> torch.Tensor:
        return 1.0 + torch.rand(*shape, generator=g)  # no zeros in the input, so dropped entries are visible

    return [
        Case("training, p = 0.2, 100 000 entries", (x(200, 500),), {"p": 0.2, "training": True}),
        Case("training, p = 0.5, 40 000 entries", (x(4, 100, 100),), {"p": 0.5, "training": True}),
        Case("evaluation (training=False) is the identity", (x(30, 40),), {"p": 0.3, "training": False}),
        Case("p = 0 keeps everything", (x(50, 50),), {"p": 0.0, "training": True}),
        Case("p = 1 drops everything (without NaN)", (x(20, 20),), {"p": 1.0, "training": True}),
    ]


# --- 8: residual taken from the projected tensor (errata 0.14) ----------------------------------------
def _sublayer_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, length: int, d_model: int, heads: int) -> Case:
        x, weights = randn(g, batch, length, d_model), _projections(g, d_model)
        return Case(name, (x, *weights, heads, 1.0 + randn(g, d_model, scale=0.1), randn(g, d_model, scale=0.1)))

    return [
        case("batch 2, L = 5, d_model 16, 4 heads", 2, 5, 16, 4),
        case("batch 3, L = 4, d_model 8, 2 heads", 3, 4, 8, 2),
        case("batch 1, L = 6, d_model 8, 1 head", 1, 6, 8, 1),
    ]


def _sublayer_reference(v: View) -> torch.Tensor:
    x, w_q, w_k, w_v, w_o, heads, norm_weight, norm_bias = v.args
    attended = _torch_mha(x, x, x, w_q, w_k, w_v, w_o, heads)
    return F.layer_norm(x.double() + attended, (x.shape[-1],), norm_weight.double(), norm_bias.double())


def _residual_from_queries(v: View) -> torch.Tensor:
    x, w_q, w_k, w_v, w_o, heads, norm_weight, norm_bias = v.x
    attended = _torch_mha(x, x, x, w_q, w_k, w_v, w_o, heads)
    return F.layer_norm(x @ w_q + attended, (x.shape[-1],), norm_weight, norm_bias)


_SUBLAYER = Check(reference=_sublayer_reference, outputs=(
    Out("output", "LayerNorm(x + nn.MultiheadAttention(x, x, x))", atol=1e-4, rtol=1e-3),),
    mistakes=(Mistake(_residual_from_queries, "your residual adds the projected queries (x @ w_q): the residual "
                                              "connection adds the sub-layer's input x itself"),))


# --- 9: a decoder without its causal mask (errata 1.11) ------------------------------------------------
def _causal_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, length: int, d: int, cut: int | None = None) -> Case:
        weights = _projections(g, d, count=3)  # drawn before the input
        return Case(name, (randn(g, batch, length, d), *weights), data={} if cut is None else {"cut": cut})

    return [
        case("no causal leakage: tokens from position 3 on are changed", 2, 6, 8, cut=3),
        case("batch 2, L = 5, d = 8", 2, 5, 8),
        case("batch 1, L = 7, d = 4", 1, 7, 4),
    ]


def _run_causal(obj: Any, case: Case) -> Any:
    if "cut" not in case.data:
        return call_function(obj, case)
    (x, *weights), _ = case.fresh_args()
    changed = x.clone()
    changed[:, case.data["cut"]:] += 1.0
    return obj(x, *weights), obj(changed, *weights)


def _no_leak(v: View) -> str | None:
    if v.extra is None:
        return None
    cut = v.data["cut"]
    problem = tensor_problem(v.extra, "your output", v.args[0].shape)
    if problem:
        return problem
    change = (f64(v.extra) - f64(v.got.output))[:, :cut].abs().amax(dim=(0, 2))  # (cut,)
    if change.max() > 1e-5:
        position = int(change.argmax())
        return (f"causal leakage: changing the tokens from position {cut} on changed your output at position "
                f"{position} by {fmt(float(change[position]))}; position i may only attend to positions <= i")
    return None


_CAUSAL = Check(
    reference=lambda v: F.scaled_dot_product_attention(*(v.x[0] @ w for w in v.x[1:]), is_causal=True),
    outputs=(Out("output", "F.scaled_dot_product_attention(q, k, v, is_causal=True)"),),
    unpack=second_run("cut", message="expected your function to return one tensor"), properties=(_no_leak,),
    advice=" (a causal row is NaN when its query may attend to no key at all: the mask must keep the diagonal, "
           "each position attends to itself and the positions before it)",
)


def _part(name: str, make_cases: Any, verify: Any, run: Any = call_function) -> Part:
    # All or nothing: the buggy starting code already passes the cases its bug does not touch.
    return Part(name=name, points=1, make_cases=make_cases, verify=verify, run=run, all_or_nothing=True)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: bug_hunt.toml
    id="bug_hunt", chapters=("05_scaling_and_masking", "06_multi_head_attention", "08_layernorm_dropout_residuals"),
    preamble=PREAMBLE,
    parts=(
        _part("multi_head_cross_attention", _cross_cases, _AGAINST_MHA),
        _part("multi_head_weights", _head_weight_cases, _HEAD_WEIGHTS),
        _part("multi_head_self_attention", _self_mha_cases, _SELF_MHA),
        _part("masked_attention", _masked_cases, _MASKED),
        _part("attention_with_loops", _loop_cases, _LOOPS),
        _part("layer_norm", _layer_norm_cases, _LAYER_NORM),
        _part("dropout", _dropout_cases, verify_dropout, run_dropout),
        _part("attention_sublayer", _sublayer_cases, _SUBLAYER),
        _part("causal_self_attention", _causal_cases, _CAUSAL, _run_causal),
    ),
))
