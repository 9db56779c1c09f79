"""Exercise 10, the decoder and the full Transformer: the checks behind
``exercises/ex10_decoder_and_transformer.ipynb``.

The learner writes chapter 10's core: the shifted target of teacher forcing, the two masks of a decoder (causal
self-attention, source padding for cross-attention), a decoder layer's forward pass from its sub-modules (in both
norm orders), and batched greedy decoding with ``model.encode``/``model.decode``.

References: ``nn.TransformerDecoderLayer`` with the same weights (float64) for the layer, the library's
``attention_course.decoding.greedy_decode`` for decoding, plain slicing and comparisons for the rest. Properties
(no leakage from later positions, padding after eos, stopping when every sentence is done) and typical mistakes
(masks with True = blocked, cross-attention with swapped roles, norm order swapped, source mask forgotten) get their
own messages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attention_course.decoding import greedy_decode
from attention_course.grading.compare import first_problem, fmt, matches, tensor_problem
from attention_course.grading.declare import Check, Out, View, second_run
from attention_course.grading.spec import Case, Exercise, Mistake, Part, preamble, with_texts
from attention_course.layers import DecoderLayer
from attention_course.transformer import Transformer

_MASKS = frozenset({"causal_mask", "padding_mask", "combine_masks"})

PREAMBLE = preamble(library=True)


def _seed_from(g: torch.Generator) -> int:
    return int(torch.randint(0, 2**31 - 1, (1,), generator=g))


def _tokens(rows: list[list[int]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.long)


# --- part 1: the shifted target ------------------------------------------------------------------------
def _shift_cases(g: torch.Generator) -> list[Case]:
    words = torch.randint(3, 20, (3, 6), generator=g).tolist()
    return [
        Case("tgt (2, 6): <bos> ... <eos>, sentence 2 padded", (_tokens([
            [1, *words[0][:4], 2], [1, *words[1][:2], 2, 0, 0]]),)),
        Case("tgt (1, 3): <bos> one word <eos>", (_tokens([[1, words[2][0], 2]]),)),
        Case("tgt (3, 8) with different bos/eos ids (5 and 6)", (_tokens([
            [5, *words[0], 6], [5, *words[1][:3], 6, 0, 0, 0], [5, *words[2][:5], 6, 0]]),)),
    ]


def _swapped(v: View) -> str | None:
    if torch.equal(v.got.decoder_input, v.want.labels) and torch.equal(v.got.labels, v.want.decoder_input):
        return ("your two tensors are swapped: the decoder's input starts with <bos> (tgt[:, :-1]) and the "
                "labels end with <eos> (tgt[:, 1:])")
    return None


def _exact(name: str, rule: str) -> Callable[[View], str | None]:
    """A step: the learner's ``name`` must equal the expected token ids exactly; else the first wrong entry."""
    def step(v: View) -> str | None:
        value, expected = getattr(v.got, name), getattr(v.want, name)
        if not torch.equal(value, expected):
            row, col = (value != expected).nonzero()[0].tolist()
            return f"{name}[{row}, {col}] is {int(value[row, col])}, expected {int(expected[row, col])}: {rule}"
        return None
    return step


_SHIFT = Check(
    reference=lambda v: (v.args[0][:, :-1], v.args[0][:, 1:]),
    outputs=(Out("decoder_input", floating=False), Out("labels", floating=False)),
    explain=(_swapped, _exact("decoder_input", "the decoder sees the target without its last token, tgt[:, :-1]"),
             _exact("labels", "position t must predict token t + 1, tgt[:, 1:]")),
)


# --- part 2: the decoder's masks -----------------------------------------------------------------------
def _mask_cases(g: torch.Generator) -> list[Case]:
    def words(n: int) -> list[int]:
        return torch.randint(4, 30, (n,), generator=g).tolist()

    return [
        Case("src (2, 5) and decoder input (2, 4), both right-padded, pad_id 0",
             (_tokens([[*words(4), 2], [*words(2), 2, 0, 0]]), _tokens([[1, *words(3)], [1, *words(1), 0, 0]]), 0)),
        Case("pad_id 3", (_tokens([[*words(2), 2, 3], [*words(3), 2]]), _tokens([[1, *words(4)], [1, 3, 3, 3, 3]]),
                          3)),
        Case("no padding: src (1, 3), decoder input (1, 6)", (_tokens([[*words(2), 2]]), _tokens([[1, *words(5)]]), 0)),
        Case("decoder input of length 1 (only <bos>)", (_tokens([[*words(3), 2], [*words(1), 2, 0, 0]]),
                                                        _tokens([[1], [1]]), 0)),
        Case("batch of 3, only the sources padded", (_tokens([[*words(5), 2], [*words(2), 2, 0, 0, 0],
                                                              [*words(4), 2, 0]]), _tokens([[1, *words(2)]] * 3), 0)),
    ]


def _broadcast_problem(mask: Any, what: str, shape: tuple[int, ...]) -> str | None:
    if not isinstance(mask, Tensor):
        return f"expected {what} to be a torch.Tensor, got {type(mask).__name__}"
    if mask.dtype != torch.bool:
        return f"expected {what} to be a bool tensor (True = may attend), got dtype {mask.dtype}"
    try:
        broadcast = torch.broadcast_shapes(mask.shape, shape)
    except RuntimeError:
        broadcast = None
    if broadcast != shape:
        return (f"{what} of shape {tuple(mask.shape)} does not broadcast to the attention scores "
                f"{shape} = (batch, heads, queries, keys)")
    return None


def _verify_masks(case: Case, output: Any) -> str | None:
    src, decoder_input, pad_id = case.args
    B, Ls = src.shape
    Lt = decoder_input.size(1)
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        return "expected a tuple (self_mask, memory_mask)"
    self_mask, memory_mask = output
    problem = first_problem(
        lambda: _broadcast_problem(self_mask, "your self_mask", (B, 1, Lt, Lt)),
        lambda: _broadcast_problem(memory_mask, "your memory_mask", (B, 1, Lt, Ls)),
    )
    if problem:
        return problem
    real_query = decoder_input != pad_id  # (B, Lt): rows that matter (padded queries are ignored by the loss)
    got_self = self_mask.expand(B, 1, Lt, Lt)[:, 0]
    causal = torch.ones(Lt, Lt, dtype=torch.bool).tril().expand(B, Lt, Lt)
    rows = real_query[:, :, None].expand(B, Lt, Lt)
    if not torch.equal(got_self[rows], causal[rows]):
        if torch.equal(got_self[rows], ~causal[rows]):
            return "your self_mask is inverted: in the course True means 'may attend' (keys j <= i for query i)"
        if Lt > 1 and torch.equal(got_self[rows], torch.ones(Lt, Lt, dtype=torch.bool).triu().expand(B, Lt, Lt)[rows]):
            return "your self_mask lets query i see keys j >= i (upper triangle): it must be j <= i (lower, tril)"
        b, i, j = ((got_self != causal) & rows).nonzero()[0].tolist()
        return (f"self_mask for sentence {b}, query {i}, key {j} is {bool(got_self[b, i, j])}, expected "
                f"{bool(causal[b, i, j])}: a real position i may attend exactly to positions 0..i")
    got_memory = memory_mask.expand(B, 1, Lt, Ls)[:, 0]
    expected_memory = (src != pad_id)[:, None, :].expand(B, Lt, Ls)
    rows = real_query[:, :, None].expand(B, Lt, Ls)
    if not torch.equal(got_memory[rows], expected_memory[rows]):
        if torch.equal(got_memory[rows], ~expected_memory[rows]):
            return "your memory_mask is inverted: True must mean 'may attend', False on the source's padding"
        b, i, j = ((got_memory != expected_memory) & rows).nonzero()[0].tolist()
        return (f"memory_mask for sentence {b}, target position {i}, source position {j} is "
                f"{bool(got_memory[b, i, j])}, expected {bool(expected_memory[b, i, j])}: cross-attention may "
                "read every source token except the source's padding (and is not causal)")
    return None


# --- part 3: a decoder layer's forward pass ------------------------------------------------------------
class DecoderSublayers(nn.Module):
    """The sub-modules of a decoder layer without a forward pass of its own: the learner writes that.

    Attributes (as in :class:`attention_course.DecoderLayer`): ``self_attention`` and ``cross_attention``
    (``MultiHeadAttention``, ``(query, key, value, mask=None) -> (output, weights)``), ``feed_forward``,
    ``norm1``, ``norm2``, ``norm3`` and the flag ``norm_first``. In evaluation mode: no dropout.
    """

    def __init__(self, layer: DecoderLayer) -> None:
        super().__init__()
        self.self_attention = layer.self_attention
        self.cross_attention = layer.cross_attention
        self.feed_forward = layer.feed_forward
        self.norm1, self.norm2, self.norm3 = layer.norm1, layer.norm2, layer.norm3
        self.norm_first = layer.norm_first
        self.eval()

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise RuntimeError("this layer has no forward pass of its own: compose its sub-modules (self_attention, "
                           "cross_attention, feed_forward, norm1, norm2, norm3) yourself")


def _random_torch_layer(g: torch.Generator, d_model: int, heads: int, d_ff: int, norm_first: bool):
    with torch.random.fork_rng():  # build with the global RNG untouched, then draw every weight from g
        layer = nn.TransformerDecoderLayer(d_model, heads, d_ff, dropout=0.0, batch_first=True,
                                           norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            if name.startswith("norm"):  # gains near 1, biases near 0, so the norms matter but stay sane
                base = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(base + 0.2 * torch.randn(parameter.shape, generator=g, dtype=torch.float64))
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=torch.float64) * d_model**-0.5)
    return layer.eval()


def _layer_case(g: torch.Generator, name: str, B: int, Lt: int, Ls: int, d: int, heads: int, norm_first: bool,
                causal: bool = True, padded: bool = True, data: dict | None = None) -> Case:
    reference = _random_torch_layer(g, d, heads, 2 * d, norm_first)
    sublayers = DecoderSublayers(DecoderLayer.from_torch(reference))
    y = torch.randn(B, Lt, d, generator=g, dtype=torch.float64)
    memory = torch.randn(B, Ls, d, generator=g, dtype=torch.float64)
    self_mask = torch.ones(Lt, Lt, dtype=torch.bool).tril() if causal else None
    memory_mask = None
    if padded:
        lengths = torch.full((B,), Ls)
        lengths[1:] = torch.randint(1, Ls, (B - 1,), generator=g)
        memory_mask = (torch.arange(Ls)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Ls)
    return Case(name, (sublayers, y, memory, self_mask, memory_mask),
                data={"reference": reference, **(data or {})})


def _layer_cases(g: torch.Generator) -> list[Case]:
    return [
        _layer_case(g, "post-norm: y (2, 4, 8), memory (2, 6, 8), causal and source-padding masks", 2, 4, 6, 8, 2,
                    False),
        _layer_case(g, "pre-norm (layer.norm_first is True): same shapes", 2, 4, 6, 8, 2, True),
        _layer_case(g, "no masks: y (1, 3, 8), memory (1, 5, 8)", 1, 3, 5, 8, 2, False, causal=False, padded=False),
        _layer_case(g, "target longer than source: y (2, 7, 12), memory (2, 3, 12), 3 heads", 2, 7, 3, 12, 3, False),
        _layer_case(g, "one target position: y (3, 1, 8)", 3, 1, 5, 8, 4, False),
        _layer_case(g, "no leakage: changing positions 3 and 4 of y must not change outputs 0 to 2", 2, 5, 4, 8, 2,
                    False, data={"future": torch.randn(2, 2, 8, generator=g, dtype=torch.float64)}),
    ]


def _run_layer(obj: Any, case: Case) -> Any:
    args, kwargs = case.fresh_args()
    sublayers, y, memory, self_mask, memory_mask = args
    with torch.no_grad():
        plain = obj(sublayers, y.clone(), memory, self_mask, memory_mask, **kwargs)
        if "future" not in case.data:
            return plain
        changed = y.clone()
        changed[:, 3:] = case.data["future"]
        return plain, obj(sublayers, changed, memory, self_mask, memory_mask, **kwargs)


def _torch_reference(layer: nn.TransformerDecoderLayer, y: Tensor, memory: Tensor, self_mask: Tensor | None,
                     memory_mask: Tensor | None) -> Tensor:
    with torch.no_grad():
        return layer(y, memory, tgt_mask=None if self_mask is None else ~self_mask,
                     memory_key_padding_mask=None if memory_mask is None else ~memory_mask[:, 0, 0])


def _variant(sub: DecoderSublayers, y: Tensor, memory: Tensor, self_mask: Tensor | None, memory_mask: Tensor | None,
             norm_first: bool) -> Tensor:
    """The layer in a given norm order, for diagnosing answers that match the wrong one."""
    with torch.no_grad():
        def attend(module: nn.Module, q: Tensor, kv: Tensor, mask: Tensor | None) -> Tensor:
            return module(q, kv, kv, mask=mask)[0]

        if norm_first:
            y = y + attend(sub.self_attention, sub.norm1(y), sub.norm1(y), self_mask)
            y = y + attend(sub.cross_attention, sub.norm2(y), memory, memory_mask)
            return y + sub.feed_forward(sub.norm3(y))
        y = sub.norm1(y + attend(sub.self_attention, y, y, self_mask))
        y = sub.norm2(y + attend(sub.cross_attention, y, memory, memory_mask))
        return sub.norm3(y + sub.feed_forward(y))


# This exercise's tolerance for "the same tensor" (shape-strict, compared in float64).
_matches = functools.partial(matches, atol=1e-6, rtol=1e-5)


def _order_message(v: View) -> str:
    first = v.args[0].norm_first
    return (f"your output is the other norm order's: this layer is {'pre-norm' if first else 'post-norm'} "
            f"(layer.norm_first is {first}); post-norm is norm(x + f(x)), pre-norm is x + f(norm(x))")


# The usual wrong decoder layers, each computed from the case's (or view's) inputs: (sub, y, memory, self_mask,
# memory_mask).
_LAYER_MISTAKES = (
    Mistake(lambda c: _variant(*c.args, not c.args[0].norm_first), _order_message),
    Mistake(lambda c: None if c.args[3] is None else _variant(*c.args[:3], None, c.args[4], c.args[0].norm_first),
            "your self-attention ignores self_mask: pass it to layer.self_attention(..., mask=self_mask)"),
    Mistake(lambda c: None if c.args[4] is None else _variant(*c.args[:4], None, c.args[0].norm_first),
            "your cross-attention ignores memory_mask: pass it to layer.cross_attention(..., mask=memory_mask)"),
)


def _layer_shape(v: View) -> str | None:
    output, (B, Lt, d), Ls = v.output, v.args[1].shape, v.args[2].size(1)
    if isinstance(output, (tuple, list)) and len(output) == 2 and isinstance(output[0], Tensor):
        return "return the layer's output tensor only (MultiHeadAttention returns (output, weights): keep output)"
    if isinstance(output, Tensor) and Ls != Lt and tuple(output.shape) == (B, Ls, d):
        return (f"your output has the source's length {Ls} instead of the target's {Lt}: in cross-attention the "
                "queries come from the decoder (y) and the keys and values from memory")
    return None


def _layer_leakage(v: View) -> str | None:
    if v.extra is None:
        return None
    problem = tensor_problem(v.extra, "your output", v.want.output.shape)
    if problem:
        return problem
    gap = float((v.extra.to(torch.float64)[:, :3] - v.got.output.to(torch.float64)[:, :3]).abs().max())
    if not gap <= 1e-9:
        return (f"changing positions 3 and 4 of y changed outputs 0 to 2 by up to {fmt(gap)}: position i must "
                "only see positions 0..i (apply self_mask in the self-attention)")
    return None


_LAYER = Check(
    reference=lambda v: _torch_reference(v.data["reference"], *v.args[1:]),
    outputs=(Out("output", "nn.TransformerDecoderLayer with the same weights", atol=1e-6, rtol=1e-5),),
    unpack=second_run("future"),
    before=(_layer_shape,),
    mistakes=_LAYER_MISTAKES,
    matches=_matches,
    explain=(_layer_leakage,),
)


# --- part 4: greedy decoding ---------------------------------------------------------------------------
class ScriptedTranslator(nn.Module):
    """A fake encoder–decoder that 'translates' source sentence ``r`` into ``scripts[r]``, word by word.

    The first source token is the sentence's number ``r``; ``decode`` gives the highest logit to
    ``scripts[r][t]`` at position ``t`` (counting the position after <bos> as 0), and to ``junk`` past the end
    of the script, so that whatever a decoder writes after eos shows up. Called without a causal ``tgt_mask``,
    it answers :data:`UNMASKED` everywhere, so that a decoder that forgets the mask is caught; with
    ``memory_pad_id`` it does the same when the source padding mask is missing or wrong.
    """

    def __init__(self, scripts: list[list[int]], vocab_size: int, junk: int, memory_pad_id: int | None = None) -> None:
        super().__init__()
        self.scripts = [list(script) for script in scripts]
        self.vocab_size = vocab_size
        self.junk = junk
        # With a pad id, decode also demands the source padding mask, True = may attend: (src != pad)[:, None, None, :].
        self.memory_pad_id = memory_pad_id
        self._source: Tensor | None = None

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        self._source = src
        return src[:, :1, None].to(torch.float64)  # (B, 1, 1): the sentence number

    def _memory_mask_ok(self, mask: Tensor | None) -> bool:
        if self.memory_pad_id is None:
            return True
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or self._source is None:
            return False
        expected = (self._source != self.memory_pad_id)[:, None, None, :]  # (B, 1, 1, Ls)
        try:
            return bool(torch.equal(torch.broadcast_to(mask, expected.shape), expected))
        except RuntimeError:
            return False

    @staticmethod
    def _is_causal(mask: Tensor | None, length: int) -> bool:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape[-2:]) != (length, length):
            return False
        return bool((mask.reshape(-1, length, length) == torch.ones(length, length, dtype=torch.bool).tril()).all())

    def decode(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
               memory_mask: Tensor | None = None) -> Tensor:
        rows, length = memory[:, 0, 0].long().tolist(), tgt.size(1)
        if self._is_causal(tgt_mask, length) and self._memory_mask_ok(memory_mask):
            wanted = [[self.scripts[r][t] if t < len(self.scripts[r]) else self.junk for t in range(length)]
                      for r in rows]
        else:
            wanted = [[UNMASKED] * length for _ in rows]
        return 5.0 * nn.functional.one_hot(torch.tensor(wanted), self.vocab_size).to(torch.float64)  # (B, t, V)


UNMASKED = 12  # what the scripted model answers when decode gets no causal mask (its vocabulary has 13 tokens)


def _random_transformer(g: torch.Generator, vocab: int) -> Transformer:
    with torch.random.fork_rng():
        torch.manual_seed(_seed_from(g))
        model = Transformer(vocab, vocab, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
                            d_ff=32, dropout=0.0, max_len=32)
    return model.double().eval()


def _greedy_cases(g: torch.Generator) -> list[Case]:
    vocab = 12

    def sources(lengths: list[int], pad: int, width: int) -> Tensor:
        rows = []
        for length in lengths:
            words = torch.randint(4, vocab, (length,), generator=g).tolist()
            rows.append(words + [pad] * (width - length))
        return _tokens(rows)

    scripts = [[7, 8, 2], [9, 10, 11, 7, 2]]
    scripted = vocab + 1  # the scripted models' vocabulary: one more token, UNMASKED
    return [
        Case("a random Transformer: 3 source sentences, 2 of them padded; max_len 8",
             (_random_transformer(g, vocab), sources([6, 4, 2], 0, 6), 8, 1, 2, 0)),
        Case("a scripted model: sentence 0 ends after 2 words, sentence 1 after 4 (stop then; pad after eos)",
             (ScriptedTranslator(scripts, scripted, junk=5), _tokens([[0, 4], [1, 4]]), 10, 1, 2, 0)),
        Case("a sentence that never ends: max_len 5 cuts it", (ScriptedTranslator([[7] * 20], scripted, junk=5),
                                                               _tokens([[0, 4]]), 5, 1, 2, 0)),
        Case("other special ids: bos 3, eos 4, pad 6", (ScriptedTranslator([[7, 4], [8, 9, 10, 4], [4]], scripted,
                                                                           junk=5), _tokens([[0], [1], [2]]), 9,
                                                        3, 4, 6)),
        Case("a scripted model with a padded source (pad 6): the source padding mask must reach decode",
             (ScriptedTranslator([[7, 2], [8, 9, 2]], scripted, junk=5, memory_pad_id=6),
              _tokens([[0, 4, 6], [1, 4, 4]]), 6, 1, 2, 6)),
        Case("a random Transformer, one unpadded sentence, max_len 6",
             (_random_transformer(g, vocab), sources([5], 0, 5), 6, 1, 2, 0)),
    ]


def _run_greedy(obj: Any, case: Case) -> Any:
    args, kwargs = case.fresh_args()
    with torch.no_grad():
        return obj(*args, **kwargs)


def _verify_greedy(case: Case, output: Any) -> str | None:
    model, src, max_len, bos_id, eos_id, pad_id = case.args
    expected = greedy_decode(model, src, max_len, bos_id, eos_id, pad_id=pad_id)
    problem = tensor_problem(output, "your tokens", floating=False)
    if problem:
        return problem
    if output.dim() != 2 or output.size(0) != src.size(0):
        return f"expected your tokens of shape (batch={src.size(0)}, T), got {tuple(output.shape)}"
    if not bool((output[:, 0] == bos_id).all()):
        return f"every row must start with bos_id = {bos_id}, got first column {output[:, 0].tolist()}"
    if isinstance(model, ScriptedTranslator) and bool((output == UNMASKED).any()):
        needed = ("pass a causal mask to model.decode as tgt_mask: a (t, t) bool matrix, True on and below the "
                  "diagonal, for a prefix of t tokens")
        if model.memory_pad_id is not None:
            needed += (f", and the source padding mask as memory_mask: (src != pad_id)[:, None, None, :], "
                       f"here with pad_id = {model.memory_pad_id}")
        return needed
    if output.size(1) != expected.size(1):
        width = expected.size(1)
        return (f"your tokens have {output.size(1)} columns, expected {width}: bos plus one column per step, and "
                f"decoding stops as soon as every sentence has produced eos ({eos_id}) or after max_len = {max_len} "
                "steps")
    if torch.equal(output.long(), expected):
        return None
    row, col = (output.long() != expected).nonzero()[0].tolist()
    after_eos = bool((expected[row, 1:col] == eos_id).any())
    if after_eos:
        return (f"sentence {row}, column {col}: yours {int(output[row, col])}, expected {int(expected[row, col])}: "
                f"after a sentence's eos every column holds pad_id = {pad_id}")
    no_source_mask = torch.ones(src.size(0), 1, 1, src.size(1), dtype=torch.bool)
    unmasked = greedy_decode(model, src, max_len, bos_id, eos_id, pad_id=pad_id, src_mask=no_source_mask)
    if isinstance(model, Transformer) and torch.equal(output.long(), unmasked):
        return ("your translations of padded sentences differ: build the source padding mask from pad_id and pass "
                "it to model.encode and (as memory_mask) to model.decode")
    return (f"sentence {row}, column {col}: yours {int(output[row, col])}, expected {int(expected[row, col])} (the "
            "argmax of the last position's logits, given the prefix so far; did you pass the causal mask to "
            "model.decode?)")


EXERCISE = with_texts(Exercise(  # title, summaries and hints: ex10.toml
    id="ex10", chapters=("10_decoder_and_transformer",), preamble=PREAMBLE,
    allowed={"decoder_layer_forward": _MASKS, "greedy_decode": _MASKS},
    parts=(
        Part("shift_target", points=1, make_cases=_shift_cases, verify=_SHIFT),
        Part("decoder_masks", points=2, make_cases=_mask_cases, verify=_verify_masks),
        Part("decoder_layer_forward", points=2, make_cases=_layer_cases, verify=_LAYER, run=_run_layer),
        Part("greedy_decode", points=3, make_cases=_greedy_cases, verify=_verify_greedy, run=_run_greedy),
    ),
))
