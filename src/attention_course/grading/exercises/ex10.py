"""Exercise 10, the decoder and the full Transformer (``exercises/ex10_decoder_and_transformer.ipynb``).

The learner writes the shifted target of teacher forcing, a decoder's two masks, a decoder layer's forward pass
from its sub-modules (both norm orders) and batched greedy decoding. References: ``nn.TransformerDecoderLayer``
with the same weights (float64), the library's ``greedy_decode``, plain slicing. Recognised mistakes: masks with
True = blocked, leakage from later positions, cross-attention's roles swapped, the other norm order, a mask left
out, tokens after eos or after every sentence has ended.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from attention_course.grading.compare import fmt, matches, tensor_problem
from attention_course.grading.declare import Check, Out, View, second_run
from attention_course.grading.findings import FailureKind, Finding
from attention_course.grading.package_view import instructor_side
from attention_course.grading.spec import (
    Case,
    Exercise,
    Mistake,
    Part,
    call_function,
    degenerate,
    preamble,
    randn,
    with_texts,
)

# The references run in the grader's process only: the sandbox's view of the package lacks them.
greedy_decode = instructor_side("attention_course.decoding", "greedy_decode")
DecoderLayer = instructor_side("attention_course.layers", "DecoderLayer")
Transformer = instructor_side("attention_course.transformer", "Transformer")

_MASKS = frozenset({"causal_mask", "padding_mask", "combine_masks"})

PREAMBLE = preamble(library=True)


def _tokens(rows: list[list[int]]) -> Tensor:
    return torch.tensor(rows, dtype=torch.long)


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether a tensor of ``shape`` broadcasts to exactly ``target``."""
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


# --- part 1: the shifted target ------------------------------------------------------------------------
def _shift_cases(g: torch.Generator) -> list[Case]:
    words = torch.randint(3, 20, (3, 6), generator=g).tolist()
    padded = _tokens([[1, *words[0][:4], 2], [1, *words[1][:2], 2, 0, 0]])
    other_ids = _tokens([[5, *words[0], 6], [5, *words[1][:3], 6, 0, 0, 0], [5, *words[2][:5], 6, 0]])
    return [
        Case("tgt (2, 6): <bos> ... <eos>, sentence 2 padded", (padded,)),
        Case("tgt (1, 3): <bos> one word <eos>", (_tokens([[1, words[2][0], 2]]),)),
        Case("tgt (3, 8) with different bos/eos ids (5 and 6)", (other_ids,)),
    ]


def _swapped(v: View) -> str | None:
    if torch.equal(v.got.decoder_input, v.want.labels) and torch.equal(v.got.labels, v.want.decoder_input):
        return ("your two tensors are swapped: the decoder's input starts with <bos> (the target without its "
                "last token) and the labels end with <eos> (the target without its first token)")
    return None


def _exact(name: str, rule: str) -> Callable[[View], str | None]:
    """A step: the learner's ``name`` must equal the expected token ids exactly; else the first wrong entry."""
    def step(v: View) -> str | None:
        value, expected = getattr(v.got, name), getattr(v.want, name)
        if torch.equal(value, expected):
            return None
        row, col = (value != expected).nonzero()[0].tolist()
        return f"{name}[{row}, {col}] is {int(value[row, col])}, expected {int(expected[row, col])}: {rule}"
    return step


_SHIFT = Check(
    reference=lambda v: (v.args[0][:, :-1], v.args[0][:, 1:]),
    outputs=(Out("decoder_input", floating=False), Out("labels", floating=False)),
    explain=(_swapped, _exact("decoder_input", "the decoder sees the target without its last token"),
             _exact("labels", "position t must predict token t + 1 (the target without its first token)")),
)


# --- part 2: the decoder's masks -----------------------------------------------------------------------
def _mask_cases(g: torch.Generator) -> list[Case]:
    def words(n: int) -> list[int]:
        return torch.randint(4, 30, (n,), generator=g).tolist()

    return [
        Case("src (2, 5) and decoder input (2, 4), both right-padded, pad_id 0",
             (_tokens([[*words(4), 2], [*words(2), 2, 0, 0]]), _tokens([[1, *words(3)], [1, *words(1), 0, 0]]), 0)),
        Case("pad_id 3", (_tokens([[*words(2), 2, 3], [*words(3), 2]]), _tokens([[1, *words(4)], [1, 3, 3, 3, 3]]), 3)),
        Case("no padding: src (1, 3), decoder input (1, 6)", (_tokens([[*words(2), 2]]), _tokens([[1, *words(5)]]), 0)),
        degenerate(Case("decoder input of length 1 (only <bos>)",
             (_tokens([[*words(3), 2], [*words(1), 2, 0, 0]]), _tokens([[1], [1]]), 0))),
        Case("batch of 3, only the sources padded",
             (_tokens([[*words(5), 2], [*words(2), 2, 0, 0, 0], [*words(4), 2, 0]]), _tokens([[1, *words(2)]] * 3), 0)),
    ]


def _broadcast_problem(mask: Any, what: str, shape: tuple[int, ...]) -> Finding | None:
    if not isinstance(mask, Tensor):
        return Finding(f"expected {what} to be a torch.Tensor, got {type(mask).__name__}", FailureKind.TYPE)
    if mask.dtype != torch.bool:
        return Finding(f"expected {what} to be a bool tensor (True = may attend), got dtype {mask.dtype}",
                       FailureKind.DTYPE)
    if not _broadcasts(mask.shape, shape):
        return Finding(f"{what} of shape {tuple(mask.shape)} does not broadcast to the attention scores "
                       f"{shape} = (batch, heads, queries, keys)", FailureKind.SHAPE)
    return None


def _known(message: str) -> Finding:
    """A message for an answer recognised as a usual mistake (an inverted mask, tokens after eos, a mask left out)."""
    return Finding(message, FailureKind.KNOWN_MISTAKE)


def _wrong_entry(name: str, got: Tensor, expected: Tensor, rows: Tensor, axes: tuple[str, str], rule: str) -> Finding:
    b, i, j = ((got != expected) & rows).nonzero()[0].tolist()
    return Finding(f"{name} for sentence {b}, {axes[0]} {i}, {axes[1]} {j} is {bool(got[b, i, j])}, expected "
                   f"{bool(expected[b, i, j])}: {rule}", FailureKind.MISMATCH)


def _verify_masks(case: Case, output: Any) -> Finding | None:
    src, decoder_input, pad_id = case.args
    (B, Ls), Lt = src.shape, decoder_input.size(1)
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        return Finding("expected a tuple (self_mask, memory_mask)", FailureKind.TYPE)
    self_mask, memory_mask = output
    problem = (_broadcast_problem(self_mask, "your self_mask", (B, 1, Lt, Lt))
               or _broadcast_problem(memory_mask, "your memory_mask", (B, 1, Lt, Ls)))
    if problem:
        return problem
    real_query = (decoder_input != pad_id)[:, :, None]  # only real rows matter: the loss ignores padded queries
    got, causal = self_mask.expand(B, 1, Lt, Lt)[:, 0], torch.ones(Lt, Lt, dtype=torch.bool).tril().expand(B, Lt, Lt)
    rows = real_query.expand(B, Lt, Lt)
    if not torch.equal(got[rows], causal[rows]):
        if Lt > 1 and torch.equal(got[rows], ~causal[rows]):  # length 1: a mask missing its diagonal looks inverted
            return _known("your self_mask is inverted: in the course True means 'may attend' (keys j <= i for query i)")
        if Lt > 1 and torch.equal(got[rows], causal.transpose(1, 2)[rows]):
            return _known("your self_mask lets query i see keys j >= i (upper triangle): it must be j <= i (lower, "
                          "tril)")
        return _wrong_entry("self_mask", got, causal, rows, ("query", "key"),
                            "a real position i may attend exactly to positions 0..i")
    got, source = memory_mask.expand(B, 1, Lt, Ls)[:, 0], (src != pad_id)[:, None, :].expand(B, Lt, Ls)
    rows = real_query.expand(B, Lt, Ls)
    if not torch.equal(got[rows], source[rows]):
        if torch.equal(got[rows], ~source[rows]):
            return _known("your memory_mask is inverted: True must mean 'may attend', False on the source's padding")
        return _wrong_entry("memory_mask", got, source, rows, ("target position", "source position"),
                            "cross-attention may read every source token except the source's padding (and is not "
                            "causal)")
    return None


# --- part 3: a decoder layer's forward pass ------------------------------------------------------------
class DecoderSublayers(nn.Module):
    """A decoder layer's sub-modules (as in :class:`attention_course.DecoderLayer`: ``self_attention``,
    ``cross_attention``, ``feed_forward``, ``norm1``-``norm3``, ``norm_first``), in evaluation mode, without a
    forward pass of its own: the learner writes that."""

    def __init__(self, layer: DecoderLayer) -> None:
        super().__init__()
        self.self_attention, self.cross_attention = layer.self_attention, layer.cross_attention
        self.feed_forward, self.norm_first = layer.feed_forward, layer.norm_first
        self.norm1, self.norm2, self.norm3 = layer.norm1, layer.norm2, layer.norm3
        self.eval()

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise RuntimeError("this layer has no forward pass of its own: compose its sub-modules (self_attention, "
                           "cross_attention, feed_forward, norm1, norm2, norm3) yourself")


def _random_torch_layer(g: torch.Generator, d_model: int, heads: int, norm_first: bool) -> nn.TransformerDecoderLayer:
    with torch.random.fork_rng():  # build with the global RNG untouched, then draw every weight from g
        layer = nn.TransformerDecoderLayer(d_model, heads, 2 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=norm_first, dtype=torch.float64)
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            if name.startswith("norm"):  # gains near 1, biases near 0, so the norms matter but stay sane
                base = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(base + randn(g, *parameter.shape, scale=0.2, dtype=torch.float64))
            else:
                parameter.copy_(randn(g, *parameter.shape, scale=d_model**-0.5, dtype=torch.float64))
    return layer.eval()


def _layer_case(g: torch.Generator, name: str, B: int, Lt: int, Ls: int, d: int, heads: int,
                norm_first: bool = False, masked: bool = True, future: bool = False) -> Case:
    """A random layer and inputs; ``future``: new values for positions 3 onwards of y (a leakage test)."""
    data = {"future": randn(g, B, Lt - 3, d, dtype=torch.float64)} if future else {}
    reference = _random_torch_layer(g, d, heads, norm_first)
    sublayers = DecoderSublayers(DecoderLayer.from_torch(reference))
    y, memory = randn(g, B, Lt, d, dtype=torch.float64), randn(g, B, Ls, d, dtype=torch.float64)
    self_mask = memory_mask = None
    if masked:  # causal self-attention; every sentence but the first has source padding
        self_mask = torch.ones(Lt, Lt, dtype=torch.bool).tril()
        lengths = torch.full((B,), Ls)
        lengths[1:] = torch.randint(1, Ls, (B - 1,), generator=g)
        memory_mask = (torch.arange(Ls)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, Ls)
    return Case(name, (sublayers, y, memory, self_mask, memory_mask), data={"reference": reference, **data})


def _layer_cases(g: torch.Generator) -> list[Case]:
    return [
        _layer_case(g, "post-norm: y (2, 4, 8), memory (2, 6, 8), causal and source-padding masks", 2, 4, 6, 8, 2),
        _layer_case(g, "pre-norm (layer.norm_first is True): same shapes", 2, 4, 6, 8, 2, norm_first=True),
        _layer_case(g, "no masks: y (1, 3, 8), memory (1, 5, 8)", 1, 3, 5, 8, 2, masked=False),
        _layer_case(g, "target longer than source: y (2, 7, 12), memory (2, 3, 12), 3 heads", 2, 7, 3, 12, 3),
        _layer_case(g, "one target position: y (3, 1, 8)", 3, 1, 5, 8, 4),
        _layer_case(g, "no leakage: changing positions 3 and 4 of y must not change outputs 0 to 2",
                    2, 5, 4, 8, 2, future=True),
    ]


def _run_layer(obj: Any, case: Case) -> Any:
    (sublayers, y, *masks), kwargs = case.fresh_args()
    with torch.no_grad():
        plain = obj(sublayers, y.clone(), *masks, **kwargs)
        if "future" not in case.data:
            return plain
        changed = y.clone()
        changed[:, 3:] = case.data["future"]
        return plain, obj(sublayers, changed, *masks, **kwargs)


def _torch_reference(layer: nn.TransformerDecoderLayer, y: Tensor, memory: Tensor, self_mask: Tensor | None,
                     memory_mask: Tensor | None) -> Tensor:
    with torch.no_grad():  # PyTorch's masks are True = blocked
        return layer(y, memory, tgt_mask=None if self_mask is None else ~self_mask,
                     memory_key_padding_mask=None if memory_mask is None else ~memory_mask[:, 0, 0])


def _variant(sub: DecoderSublayers, y: Tensor, memory: Tensor, self_mask: Tensor | None, memory_mask: Tensor | None,
             norm_first: bool, feed_forward_residual: bool = True) -> Tensor:
    """The layer in a given norm order (and with or without its post-norm feed-forward residual), for diagnosing
    answers that match a wrong one."""
    def attend(module: nn.Module, q: Tensor, kv: Tensor, mask: Tensor | None) -> Tensor:
        return module(q, kv, kv, mask=mask)[0]

    with torch.no_grad():
        if norm_first:
            y = y + attend(sub.self_attention, sub.norm1(y), sub.norm1(y), self_mask)
            y = y + attend(sub.cross_attention, sub.norm2(y), memory, memory_mask)
            return y + sub.feed_forward(sub.norm3(y))
        y = sub.norm1(y + attend(sub.self_attention, y, y, self_mask))
        y = sub.norm2(y + attend(sub.cross_attention, y, memory, memory_mask))
        return sub.norm3(y + sub.feed_forward(y) if feed_forward_residual else sub.feed_forward(y))


def _order_message(v: View) -> str:
    first = v.args[0].norm_first
    return (f"your output is the other norm order's: this layer is {'pre-norm' if first else 'post-norm'} "
            f"(layer.norm_first is {first}); post-norm is norm(x + f(x)), pre-norm is x + f(norm(x))")


# The usual wrong layers, from the view's inputs (sub, y, memory, self_mask, memory_mask).
_LAYER_MISTAKES = (
    Mistake(lambda v: _variant(*v.args, not v.args[0].norm_first), _order_message),
    Mistake(lambda v: None if v.args[3] is None else _variant(*v.args[:3], None, v.args[4], v.args[0].norm_first),
            "your self-attention ignores self_mask: pass it to layer.self_attention(..., mask=self_mask)"),
    Mistake(lambda v: None if v.args[4] is None else _variant(*v.args[:4], None, v.args[0].norm_first),
            "your cross-attention ignores memory_mask: pass it to layer.cross_attention(..., mask=memory_mask)"),
    Mistake(lambda v: None if v.args[0].norm_first else _variant(*v.args, False, feed_forward_residual=False),
            "your feed-forward sub-layer has no residual: post-norm adds its input back before the last norm, "
            "norm3(y + FFN(y)), as the two attention sub-layers do"),
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
    matches=functools.partial(matches, atol=1e-6, rtol=1e-5),
    explain=(_layer_leakage,),
)


# --- part 4: greedy decoding ---------------------------------------------------------------------------
UNMASKED = 12  # what the scripted model answers when decode gets no causal mask (its vocabulary has 13 tokens)


class ScriptedTranslator(nn.Module):
    """A fake encoder–decoder that 'translates' source sentence ``r`` (its first token) into ``scripts[r]``.

    ``decode`` gives the highest logit to ``scripts[r][t]`` at position ``t`` after <bos>, and to ``junk`` past the
    script's end, so that whatever a decoder writes after eos shows up. Without a causal ``tgt_mask`` (or, given
    ``memory_pad_id``, without the source padding mask) it answers :data:`UNMASKED` everywhere.
    """

    def __init__(self, scripts: list[list[int]], vocab_size: int, junk: int, memory_pad_id: int | None = None) -> None:
        super().__init__()
        self.scripts = [list(script) for script in scripts]
        self.vocab_size, self.junk, self.memory_pad_id = vocab_size, junk, memory_pad_id
        self._source: Tensor | None = None

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        self._source = src
        return src[:, :1, None].to(torch.float64)  # (B, 1, 1): the sentence number

    def _memory_mask_ok(self, mask: Tensor | None) -> bool:
        """With a pad id, the mask must be (src != pad)[:, None, None, :], True = may attend."""
        if self.memory_pad_id is None:
            return True
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or self._source is None:
            return False
        expected = (self._source != self.memory_pad_id)[:, None, None, :]  # (B, 1, 1, Ls)
        return _broadcasts(mask.shape, expected.shape) and torch.equal(mask.expand(expected.shape), expected)

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


def _random_transformer(g: torch.Generator, vocab: int) -> Transformer:
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=g)))
        model = Transformer(vocab, vocab, d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2,
                            d_ff=32, dropout=0.0, max_len=32)
    return model.double().eval()


def _decode_variant(model: Transformer, src: Tensor, max_len: int, bos_id: int, eos_id: int, pad_id: int, *,
                    causal: bool = True, source_mask: bool = True, pad_after_eos: bool = True,
                    last: bool = True) -> Tensor:
    """Batched greedy decoding, right or with one known mistake switched on (for building cases)."""
    memory_mask = (src != pad_id)[:, None, None, :] if source_mask else None
    memory = model.encode(src, memory_mask)
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        length = tokens.size(1)
        mask = torch.ones(length, length, dtype=torch.bool).tril() if causal else None
        logits = model.decode(tokens, memory, mask, memory_mask)
        next_token = logits[:, -1 if last else 0].argmax(dim=-1)
        if pad_after_eos:
            next_token = torch.where(finished, torch.full_like(next_token, pad_id), next_token)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        finished = finished | (next_token == eos_id)
        if bool(finished.all()):
            break
    return tokens


#: The known mistakes a random Transformer case must expose (see :func:`_telling_transformer`).
_DECODING_MISTAKES = {"no causal mask": {"causal": False}, "the first position's logits": {"last": False},
                      "no source padding mask": {"source_mask": False}}


def _telling_transformer(g: torch.Generator, vocab: int, sources: Callable[[], Tensor], max_len: int,
                         mistakes: tuple[str, ...]) -> tuple[Transformer, Tensor]:
    """A random Transformer (that never says eos) and source batch on which each of ``mistakes`` decodes other
    tokens than the right greedy decoding: drawn again until it does (a few draws), so that the case's verdict on
    those mistakes does not depend on the draw."""
    for _ in range(500):
        model, src = _random_transformer(g, vocab), sources()
        with torch.no_grad():
            # It never says eos (2): every sentence runs to max_len, so how a learner stops and pads after eos
            # cannot change this case's verdict (the scripted cases test that, on every draw).
            model.generator.bias[2] = -1e4
            right = _decode_variant(model, src, max_len, 1, 2, 0)
            if all(not torch.equal(right, _decode_variant(model, src, max_len, 1, 2, 0, **_DECODING_MISTAKES[name]))
                   for name in mistakes):
                return model, src
    raise RuntimeError(f"no random Transformer in 500 draws exposes {mistakes}")  # pragma: no cover


def _greedy_cases(g: torch.Generator) -> list[Case]:
    vocab = 12

    def sources(*lengths: int) -> Tensor:  # random words, right-padded with 0
        return _tokens([torch.randint(4, vocab, (n,), generator=g).tolist() + [0] * (max(lengths) - n)
                        for n in lengths])

    def scripted(*scripts: list[int], memory_pad_id: int | None = None) -> ScriptedTranslator:
        return ScriptedTranslator(list(scripts), vocab + 1, junk=5, memory_pad_id=memory_pad_id)  # + UNMASKED

    return [
        Case("a random Transformer: 3 source sentences, 2 of them padded; max_len 8",
             (*_telling_transformer(g, vocab, lambda: sources(6, 4, 2), 8, tuple(_DECODING_MISTAKES)), 8, 1, 2, 0)),
        Case("a scripted model: sentence 0 ends after 2 words, sentence 1 after 4 (stop then; pad after eos)",
             (scripted([7, 8, 2], [9, 10, 11, 7, 2]), _tokens([[0, 4], [1, 4]]), 10, 1, 2, 0)),
        Case("a sentence that never ends: max_len 5 cuts it", (scripted([7] * 20), _tokens([[0, 4]]), 5, 1, 2, 0)),
        Case("other special ids: bos 3, eos 4, pad 6",
             (scripted([7, 4], [8, 9, 10, 4], [4]), _tokens([[0], [1], [2]]), 9, 3, 4, 6)),
        Case("a scripted model with a padded source (pad 6): the source padding mask must reach decode",
             (scripted([7, 2], [8, 9, 2], memory_pad_id=6), _tokens([[0, 4, 6], [1, 4, 4]]), 6, 1, 2, 6)),
        Case("a random Transformer, one unpadded sentence, max_len 6",
             (*_telling_transformer(g, vocab, lambda: sources(5), 6, ("no causal mask", "the first position's logits")),
              6, 1, 2, 0)),
    ]


def _run_greedy(obj: Any, case: Case) -> Any:
    with torch.no_grad():
        return call_function(obj, case)


def _first_position_greedy(model: Any, src: Tensor, max_len: int, bos_id: int, eos_id: int, pad_id: int) -> Tensor:
    """Greedy decoding that takes each next token from the first position's logits instead of the last's."""
    memory_mask = (src != pad_id)[:, None, None, :]
    memory = model.encode(src, memory_mask)
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        causal = torch.ones(tokens.size(1), tokens.size(1), dtype=torch.bool).tril()
        chosen = model.decode(tokens, memory, causal, memory_mask)[:, 0].argmax(dim=-1)
        chosen = torch.where(finished, torch.full_like(chosen, pad_id), chosen)
        tokens = torch.cat([tokens, chosen[:, None]], dim=1)
        finished = finished | (chosen == eos_id)
        if bool(finished.all()):
            break
    return tokens


def _verify_greedy(case: Case, output: Any) -> Finding | None:
    model, src, max_len, bos_id, eos_id, pad_id = case.args
    expected = greedy_decode(model, src, max_len, bos_id, eos_id, pad_id=pad_id)
    problem = tensor_problem(output, "your tokens", floating=False)
    if problem:
        return problem
    if output.dim() != 2 or output.size(0) != src.size(0):
        return Finding(f"expected your tokens of shape (batch={src.size(0)}, T), got {tuple(output.shape)}",
                       FailureKind.SHAPE)
    if not bool((output[:, 0] == bos_id).all()):
        return Finding(f"every row must start with bos_id = {bos_id}, got first column {output[:, 0].tolist()}",
                       FailureKind.PROPERTY)
    if isinstance(model, ScriptedTranslator) and bool((output == UNMASKED).any()):
        needed = ("pass a causal mask to model.decode as tgt_mask: a (t, t) bool matrix, True on and below the "
                  "diagonal, for a prefix of t tokens")
        if model.memory_pad_id is not None:
            needed += (f", and the source padding mask as memory_mask: True at the source's real tokens, shaped "
                       f"(batch, 1, 1, source length), here with pad_id = {model.memory_pad_id}")
        return _known(needed)  # the scripted model's answer to a missing mask
    if output.size(1) != expected.size(1):
        return Finding(f"your tokens have {output.size(1)} columns, expected {expected.size(1)}: bos plus one column "
                       f"per step, and decoding stops as soon as every sentence has produced eos ({eos_id}) or after "
                       f"max_len = {max_len} steps", FailureKind.SHAPE)
    if torch.equal(output.long(), expected):
        return None
    row, col = (output.long() != expected).nonzero()[0].tolist()
    yours = f"sentence {row}, column {col}: yours {int(output[row, col])}, expected {int(expected[row, col])}"
    if bool((expected[row, 1:col] == eos_id).any()):
        return _known(f"{yours}: after a sentence's eos every column holds pad_id = {pad_id}")
    no_source_mask = torch.ones(src.size(0), 1, 1, src.size(1), dtype=torch.bool)
    unmasked = greedy_decode(model, src, max_len, bos_id, eos_id, pad_id=pad_id, src_mask=no_source_mask)
    if isinstance(model, Transformer) and torch.equal(output.long(), unmasked):
        return _known("your translations of padded sentences differ: build the source padding mask from pad_id and "
                      "pass it to model.encode and (as memory_mask) to model.decode")
    if isinstance(model, Transformer):
        with torch.no_grad():
            first = _first_position_greedy(model, src, max_len, bos_id, eos_id, pad_id)
        if torch.equal(output.long(), first):
            return _known(f"{yours}: you took each next token from the first position's logits; the prediction "
                          "of the next token is the last position's (the newest token's) logits")
    return Finding(f"{yours} (the argmax of the last position's logits, given the prefix so far; did you pass the "
                   "causal mask to model.decode?)", FailureKind.MISMATCH)


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
