"""Exercise 09, the encoder: the checks behind ``exercises/ex09_the_encoder.ipynb``.

The learner writes the position-wise FFN (a ValueError when its output width is not d_model), a linear layer
as a kernel-size-1 convolution, an encoder layer from the library's parts (checked against
``nn.TransformerEncoderLayer``, whose weights are loaded into it) and a classifier head that pools over the real
tokens. Recognised mistakes: ReLU misplaced, the norm order swapped, the padding mask ignored or pooled over.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.grading.compare import close_f64, close_problem, f64, fmt, fmt_shape, tensor_problem
from attention_course.grading.declare import Check, Out, View, mistakes_on, second_run
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_expecting_error,
    call_function,
    permutation,
    preamble,
    randn,
    with_texts,
)

# The references run in the grader's process only: the sandbox's view of the package lacks them.
EncoderLayer = instructor_side("attention_course.layers", "EncoderLayer")

PREAMBLE = preamble(library=True)


# --- part 1: feed_forward -----------------------------------------------------------------------------
def _ffn_weights(g: torch.Generator, d_model: int, d_ff: int, d_out: int | None = None) -> tuple[torch.Tensor, ...]:
    d_out = d_model if d_out is None else d_out
    return (randn(g, d_model, d_ff, scale=d_model**-0.5), randn(g, d_ff, scale=0.1),
            randn(g, d_ff, d_out, scale=d_ff**-0.5), randn(g, d_out, scale=0.1))


def _ffn_cases(g: torch.Generator) -> list[Case]:
    return [
        Case("x (5, 8), d_ff = 32", (randn(g, 5, 8), *_ffn_weights(g, 8, 32))),
        Case("a batch of sequences, x (2, 6, 8), d_ff = 16", (randn(g, 2, 6, 8), *_ffn_weights(g, 8, 16))),
        Case("a hidden layer narrower than the model, d_ff = 4", (randn(g, 3, 5, 8), *_ffn_weights(g, 8, 4))),
        Case("reordering the positions reorders the outputs (position-wise)",
             (randn(g, 7, 6), *_ffn_weights(g, 6, 24)), data={"perm": permutation(g, 7)}),
        Case("W2 maps to width 12, but d_model is 8: ValueError naming both",
             (randn(g, 4, 8), *_ffn_weights(g, 8, 16, d_out=12)), data={"error": (12, 8)}),
        Case("W1 expects 10 features, x has 8: ValueError naming both",
             (randn(g, 4, 8), randn(g, 10, 16), randn(g, 16), randn(g, 16, 8), randn(g, 8)),
             data={"error": (10, 8)}),
    ]


def _run_ffn(obj: Any, case: Case) -> Any:
    output = call_expecting_error(obj, case)
    if "perm" not in case.data:
        return output
    (x, *weights), _ = case.fresh_args()
    return output, obj(x[case.data["perm"]].clone(), *weights)


def _ffn(x: torch.Tensor, W1: torch.Tensor, b1: torch.Tensor, W2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ W1 + b1) @ W2 + b2


_FFN_MISTAKES = (  # (x, W1, b1, W2, b2) in float64 -> a wrong FFN output
    Mistake(lambda x, W1, b1, W2, b2: (x @ W1 + b1) @ W2 + b2,
            "your output has no non-linearity: apply ReLU to the hidden layer, max(0, x W1 + b1)"),
    Mistake(lambda x, W1, b1, W2, b2: torch.relu((x @ W1 + b1) @ W2 + b2),
            "you applied ReLU to the output; it belongs on the hidden layer only"),
    Mistake(lambda x, W1, b1, W2, b2: torch.relu(x @ W1 + b1).cumsum(dim=-2) @ W2 + b2 if x.dim() > 1 else None,
            "your output at a position sums the hidden layers of the positions up to it: the FFN treats every "
            "position alone (nothing mixes positions)"),
)


def _position_wise(v: View) -> str | None:
    if v.extra is None:
        return None
    if problem := tensor_problem(v.extra, "your output", v.want.output.shape):
        return problem
    gap = float((f64(v.extra) - f64(v.got.output)[v.data["perm"]]).abs().max())
    if not gap <= 1e-4:
        return (f"reordering the input positions should reorder your outputs the same way (the FFN treats every "
                f"position alone), but they differ by up to {fmt(gap)}")
    return None


_FFN = Check(
    reference=lambda v: _ffn(*v.x),
    outputs=(Out("output", "relu(x @ W1 + b1) @ W2 + b2"),),
    raises=lambda v: (v.data["error"], "the FFN's output must have width d_model, and W1 must match x's features")
    if "error" in v.data else None,
    unpack=second_run("perm", message="expected a tensor"),
    mistakes=mistakes_on(_FFN_MISTAKES, lambda v: v.x),
    matches=close_f64,
    after=(_position_wise,),
)


# --- part 2: linear_to_conv1d ------------------------------------------------------------------------
def _conv_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, d_in: int, d_out: int, batch: int, length: int) -> Case:
        return Case(name, (randn(g, d_in, d_out, scale=d_in**-0.5), randn(g, d_out, scale=0.1)),
                    data={"x": randn(g, batch, length, d_in)})

    return [
        case("W (8, 32), b (32,): the first layer of an FFN with d_model 8, d_ff 32", 8, 32, 2, 5),
        case("W (32, 8), b (8,): the second layer", 32, 8, 3, 4),
        case("W (6, 6), b (6,): a square weight (transposing matters all the same)", 6, 6, 2, 7),
    ]


def _run_conv(obj: Any, case: Case) -> Any:
    result = call_function(obj, case)
    if not isinstance(result, tuple) or len(result) != 2:
        return {"returned": result}
    kernel, bias = result
    x = case.data["x"].clone()
    try:  # apply the learner's kernel the way nn.Conv1d would: (B, L, d) -> (B, d, L) -> conv -> back
        applied = F.conv1d(x.transpose(1, 2), kernel, bias).transpose(1, 2)
    except Exception as error:  # noqa: BLE001
        applied = f"{type(error).__name__}: {error}"[:300]
    return {"kernel": kernel, "bias": bias, "applied": applied}


def _unpack_conv(v: View) -> str | None:
    if not isinstance(v.output, dict) or "kernel" not in v.output:
        return "expected a tuple (kernel, bias)"
    v.output, v.extra = (v.output["kernel"], v.output["bias"]), v.output["applied"]
    return None


def _kernel_transposed(v: View) -> str | None:
    d_in, d_out = v.args[0].shape
    kernel = v.output[0]
    if (isinstance(kernel, torch.Tensor) and tuple(kernel.shape) == (d_out, d_in, 1)
            and torch.equal(f64(kernel).flatten(), v.x[0].flatten()) and not torch.equal(v.x[0], v.x[0].T)):
        return Finding(f"your kernel holds W's numbers in W's own order, reshaped to {fmt_shape(kernel.shape)}: "
                       "a reshape is not a transpose; kernel[o, i, 0] must be W[i, o]", FailureKind.KNOWN_MISTAKE)
    if isinstance(kernel, torch.Tensor) and d_in != d_out and tuple(kernel.shape) == (d_in, d_out, 1):
        return (f"your kernel has shape {fmt_shape(kernel.shape)}; nn.Conv1d kernels are (out_channels, "
                f"in_channels, kernel_size) = {fmt_shape((d_out, d_in, 1))}: transpose W first")
    return None


def _applied(v: View) -> str | None:
    if isinstance(v.extra, str):
        return f"F.conv1d with your kernel and bias raised {v.extra}"
    return close_problem(v.extra, f64(v.data["x"]) @ v.x[0] + v.x[1], "conv1d with your kernel",
                         "x @ W + b at every position")


_CONV = Check(
    reference=lambda v: (v.x[0].T[..., None], v.x[1]),  # judged by their effect (``_applied``), not compared
    outputs=(Out("kernel"), Out("bias")),
    unpack=_unpack_conv,
    before=(_kernel_transposed,),
    explain=(_applied,),
)


# --- part 3: the encoder layer -------------------------------------------------------------------------
def _torch_layer(d_model: int, num_heads: int, d_ff: int, dropout: float, norm_first: bool) -> nn.Module:
    return nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout, batch_first=True, norm_first=norm_first)


def _encoder_layer_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, batch: int, length: int, d_model: int, num_heads: int, d_ff: int, norm_first: bool,
             lengths: list[int] | None = None, dropout: float = 0.1, mode: str = "eval") -> Case:
        reference = _torch_layer(d_model, num_heads, d_ff, dropout, norm_first)
        with torch.no_grad():  # random weights from g (also the norms' gains and biases, which start at 1 and 0)
            for parameter in reference.parameters():
                parameter.copy_(randn(g, *parameter.shape, scale=0.3))
            for norm in (reference.norm1, reference.norm2):
                norm.weight.copy_(1.0 + randn(g, d_model, scale=0.2))
        state = EncoderLayer.from_torch(reference).state_dict()  # the same weights under the library's names
        mask = None  # (B, 1, 1, L), True = may attend (a real token)
        if lengths is not None:
            mask = (torch.arange(length)[None, :] < torch.tensor(lengths)[:, None])[:, None, None, :]
        data = {"config": (d_model, num_heads, d_ff, dropout, norm_first), "state": state,
                "torch_state": reference.state_dict(), "mode": mode}
        return Case(name, (randn(g, batch, length, d_model), mask), data=data)

    return [
        case("post-norm, no padding, x (2, 5, 16), 4 heads", 2, 5, 16, 4, 32, False),
        case("post-norm with a padding mask (lengths 6 and 3), x (2, 6, 16)", 2, 6, 16, 4, 32, False, [6, 3]),
        case("pre-norm (norm_first=True) with a padding mask, x (3, 5, 8), 2 heads", 3, 5, 8, 2, 24, True,
             [5, 2, 4]),
        case("training mode, dropout 0.5: the sub-layers' outputs are dropped out (two calls differ)", 2, 4, 8, 2, 16,
             False, mode="train"),
    ]


def _run_encoder_layer(obj: Any, case: Case) -> Any:
    d_model, num_heads, d_ff, dropout, norm_first = case.data["config"]
    module = obj(d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first)
    count = sum(p.numel() for p in module.parameters())
    try:
        module.load_state_dict(case.data["state"])
    except RuntimeError as error:
        return {"count": count, "load_error": str(error)[:600]}
    (x, mask), _ = case.fresh_args()
    if case.data["mode"] == "eval":
        module.eval()
        with torch.no_grad():
            return {"count": count, "output": module(x, mask)}
    # Switch off the dropout *inside* attention and the FFN, so that only the residual branches' dropout is left.
    attention = getattr(module, "self_attention", None)
    if isinstance(getattr(attention, "dropout", None), float):
        attention.dropout = 0.0
    inner = getattr(getattr(module, "feed_forward", None), "dropout", None)
    if hasattr(inner, "p"):
        inner.p = 0.0
    module.train()
    with torch.no_grad():
        return {"count": count, "output": module(x, mask), "again": module(x, mask)}


def _reference_encoder_layer(v: View, mask: torch.Tensor | None, norm_first: bool | None = None) -> torch.Tensor:
    d_model, num_heads, d_ff, dropout, config_norm_first = v.data["config"]
    layer = _torch_layer(d_model, num_heads, d_ff, dropout, config_norm_first if norm_first is None else norm_first)
    layer.load_state_dict(v.data["torch_state"])
    padding = None if mask is None else ~mask[:, 0, 0, :]  # PyTorch marks padding with True
    with torch.no_grad():
        return layer.double().eval()(v.x[0], src_key_padding_mask=padding)


def _unpack_layer(v: View) -> str | None:
    if not isinstance(v.output, dict) or "count" not in v.output:
        return f"expected your layer to return a tensor, got {type(v.output).__name__}"
    if "load_error" in v.output:
        return ("the check could not load nn.TransformerEncoderLayer's weights into your layer; use the attribute "
                "names of the task (self_attention, feed_forward, norm1, norm2). PyTorch said: "
                + v.output["load_error"].split("\n")[0][:300])
    v.output, v.extra = v.output.get("output"), v.output
    return None


def _parameter_count(v: View) -> str | None:
    d_model, _, d_ff, _, _ = v.data["config"]
    formula = 4 * d_model**2 + 4 * d_model + 2 * d_model * d_ff + d_ff + d_model + 4 * d_model
    if v.extra["count"] != formula:
        return (f"your layer has {v.extra['count']} parameters; an encoder layer with d_model={d_model}, "
                f"d_ff={d_ff} has 4d² + 4d (attention) + 2·d·d_ff + d_ff + d (FFN) + 4d (two LayerNorms) "
                f"= {formula}")
    return None


def _dropout_applied(v: View) -> str | None:
    again = v.extra.get("again")
    if isinstance(again, torch.Tensor) and torch.equal(again, v.got.output):
        return ("in training mode (with the dropout inside attention and the FFN switched off) two calls "
                "gave the same output: apply dropout to each sub-layer's output, before the residual add")
    return None


def _norm_order(v: View) -> str:
    norm_first = v.data["config"][4]
    return f"your layer computes the {'post' if norm_first else 'pre'}-norm order, but norm_first={norm_first}"


def _no_feed_forward_residual(v: View) -> torch.Tensor | None:
    """A post-norm layer whose second sub-layer lacks its residual: norm2(FFN(h)), h after the first."""
    d_model, num_heads, d_ff, dropout, norm_first = v.data["config"]
    if norm_first or v.data["mode"] == "train":
        return None
    layer = _torch_layer(d_model, num_heads, d_ff, dropout, norm_first)
    layer.load_state_dict(v.data["torch_state"])
    layer = layer.double().eval()
    x, mask = v.x[0], v.args[1]
    padding = None if mask is None else ~mask[:, 0, 0, :]
    with torch.no_grad():
        h = layer.norm1(x + layer.self_attn(x, x, x, key_padding_mask=padding, need_weights=False)[0])
        return layer.norm2(layer.linear2(layer.activation(layer.linear1(h))))


_ENCODER_LAYER = Check(
    # In training mode the output is random: it is its own reference, and _dropout_applied judges it.
    reference=lambda v: v.output if v.data["mode"] == "train" else _reference_encoder_layer(v, v.args[1]),
    outputs=(Out("output", "nn.TransformerEncoderLayer with the same weights (evaluation mode)", atol=1e-4, rtol=1e-3,
                 shape=lambda v: v.args[0].shape),),
    unpack=_unpack_layer,
    properties=(_parameter_count, _dropout_applied),
    mistakes=(Mistake(lambda v: _reference_encoder_layer(v, v.args[1], norm_first=not v.data["config"][4]),
                      _norm_order),
              Mistake(lambda v: None if v.args[1] is None else _reference_encoder_layer(v, None),
                      "your output matches a layer that ignores the padding mask: pass mask to the self-attention "
                      "so that no token attends to padding"),
              Mistake(_no_feed_forward_residual,
                      "your feed-forward sub-layer has no residual: post-norm adds its input back before the "
                      "norm, norm2(h + FFN(h))")),
    matches=close_f64,
)


# --- part 4: the classifier head ---------------------------------------------------------------------
def _head_cases(g: torch.Generator) -> list[Case]:
    def case(name: str, lengths: list[int], length: int, d_model: int, num_classes: int, pooling: str,
             negative: bool = False) -> Case:
        states = randn(g, len(lengths), length, d_model)
        if negative:
            states = -3.0 - states.abs()  # every real feature negative: padding filled with 0 would win a max
        keep = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]  # (B, L)
        states[~keep] = 1e4  # junk on padding: any leak into the pool shows
        data = {"config": (d_model, num_classes, pooling), "weight": randn(g, num_classes, d_model, scale=0.3),
                "bias": randn(g, num_classes, scale=0.3)}
        return Case(name, (states, keep), data=data)

    return [
        case("mean pooling, states (3, 6, 8), lengths 6, 3 and 1, 2 classes", [6, 3, 1], 6, 8, 2, "mean"),
        case("mean pooling, 4 classes, d_model 16", [5, 2], 5, 16, 4, "mean"),
        case("max pooling, states (3, 5, 8), lengths 5, 2 and 4", [5, 2, 4], 5, 8, 2, "max"),
        case("max pooling with all-negative features (padding must not win the max)", [4, 1], 4, 8, 3, "max",
             negative=True),
    ]


def _run_head(obj: Any, case: Case) -> Any:
    d_model, num_classes, pooling = case.data["config"]
    module = obj(d_model, num_classes, pooling=pooling)
    parameters = {name: list(p.shape) for name, p in module.named_parameters()}
    linear = getattr(module, "linear", None)
    if not isinstance(linear, nn.Linear):
        return {"parameters": parameters, "no_linear": True}
    (states, keep), _ = case.fresh_args()
    with torch.no_grad():
        linear.weight.copy_(case.data["weight"])
        linear.bias.copy_(case.data["bias"])
        return {"parameters": parameters, "output": module(states.clone(), keep.clone()),
                "again": module(states.clone(), keep.clone())}  # the same input twice: the same logits


def _unpack_head(v: View) -> str | None:
    if not isinstance(v.output, dict):
        return f"expected logits, got {type(v.output).__name__}"
    if v.output.get("no_linear"):
        return (f"the head needs its linear layer as self.linear = nn.Linear(d_model, num_classes), created in "
                f"__init__; yours has parameters {v.output['parameters'] or 'none'}")
    v.output, v.extra = v.output["output"], v.output
    return None


def _returned_tuple(v: View) -> str | None:
    if isinstance(v.output, (tuple, list)):
        return ("your head returned a tuple: torch.max along a dimension returns (values, indices); keep the "
                "values (or use torch.amax), then apply the linear layer and return the logits tensor")
    return None


def _head_parameters(v: View) -> str | None:
    d_model, num_classes, _ = v.data["config"]
    shapes = sorted(map(tuple, v.extra["parameters"].values()))
    if shapes != sorted([(num_classes, d_model), (num_classes,)]):
        return (f"the head should own exactly the linear layer's weight ({num_classes}, {d_model}) and bias "
                f"({num_classes},), built in __init__; yours has {v.extra['parameters'] or 'no parameters'}")
    again = v.extra.get("again")
    if isinstance(again, torch.Tensor) and not torch.equal(again, v.got.logits):
        return "the same input gave different logits on two calls: create the layers in __init__, not in forward"
    return None


def _pooled_logits(v: View, pool: str, fill: float = float("-inf"), padding: bool = False) -> torch.Tensor:
    """Logits of the case's linear layer after pooling the states: over the real tokens (``padding``: all)."""
    states, keep = v.x[0], v.args[1][..., None]
    if pool == "mean":
        pooled = states.mean(1) if padding else (states * keep).sum(1) / keep.sum(1)
    else:
        pooled = states.amax(1) if padding else states.masked_fill(~keep, fill).amax(1)
    return pooled @ f64(v.data["weight"]).T + f64(v.data["bias"])


_HEAD = Check(
    reference=lambda v: _pooled_logits(v, v.data["config"][2]),
    outputs=(Out("logits", lambda v: f"Linear({v.data['config'][2]} over the real tokens)"),),
    unpack=_unpack_head,
    before=(_returned_tuple,),
    properties=(_head_parameters,),
    mistakes=(Mistake(lambda v: _pooled_logits(v, v.data["config"][2], padding=True),
                      "padding leaked into your pool: average (or take the maximum) over the real tokens only (keep)",
                      on="logits"),
              Mistake(lambda v: _pooled_logits(v, "max", fill=0.0) if v.data["config"][2] == "max" else None,
                      "you filled the padding with 0 before the maximum; with negative features 0 wins: fill it "
                      "with -inf (or the dtype's lowest value)", on="logits")),
    matches=functools.partial(close_f64, atol=1e-2, rtol=1e-3),
)


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex09.toml
    id="ex09", chapters=("09_the_encoder",), preamble=PREAMBLE,
    allowed={"encoder_layer": frozenset({"MultiHeadAttention", "PositionwiseFeedForward", "LayerNorm", "Dropout"})},
    parts=(
        Part("feed_forward", points=1, make_cases=_ffn_cases, verify=_FFN, run=_run_ffn),
        Part("linear_to_conv1d", points=1, make_cases=_conv_cases, verify=_CONV, run=_run_conv),
        Part("encoder_layer", function="MyEncoderLayer", points=3, make_cases=_encoder_layer_cases,
             verify=_ENCODER_LAYER, run=_run_encoder_layer),
        Part("classifier_head", function="PoolingClassifierHead", points=2, make_cases=_head_cases, verify=_HEAD,
             run=_run_head),
    ),
))
