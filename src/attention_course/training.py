"""Training an encoder–decoder translator (chapter 10): loss, learning-rate schedule, one step, a loop.

- :class:`LabelSmoothingLoss`: cross-entropy against a smoothed target (Szegedy et al. 2016), equal to
  ``F.cross_entropy(..., label_smoothing=ε)``, written out so the lesson can show what it does.
- :func:`warmup_lr` and :func:`noam_schedule`: the paper's learning rate (§5.3), a linear warm-up followed by
  an inverse-square-root decay; :func:`transformer_optimizer` pairs it with Adam(β₁=0.9, β₂=0.98, ε=1e-9).
- :func:`teacher_forcing` and :func:`translation_masks`: the shifted target and the masks of one batch.
- :func:`translation_loss` and :func:`train_step`: one step of training with teacher forcing.
- :func:`train_translator`: the loop, with a step or time budget and early stopping on a score.
- :class:`TorchTranslator` (defined in :mod:`attention_course.torch_translator`, re-exported here): the same
  model built from PyTorch's ``nn.TransformerEncoder``/``Decoder`` layers, for side-by-side comparisons.
- :func:`evaluate_translations`: exact match and BLEU (sacrebleu) of a model's translations.
- :func:`teacher_forced_exact_match`: the same exact match as greedy decoding, from one forward pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attention_course.checks import check_int
from attention_course.decoding import beam_search, greedy_decode
from attention_course.masks import causal_mask, padding_mask
from attention_course.runtime import fused_adam
from attention_course.torch_translator import TorchTranslator  # moved; importable from here as before

__all__ = [
    "LabelSmoothingLoss",
    "TorchTranslator",
    "TrainingLog",
    "evaluate_translations",
    "noam_schedule",
    "teacher_forced_exact_match",
    "teacher_forcing",
    "train_step",
    "train_translator",
    "transformer_optimizer",
    "translation_loss",
    "translation_masks",
    "warmup_lr",
]


# ----------------------------------------------------------------------------------------------------------
# Loss
# ----------------------------------------------------------------------------------------------------------
class LabelSmoothingLoss(nn.Module):
    """Cross-entropy against a smoothed target distribution (Szegedy et al. 2016, §7).

    The one-hot target of class ``y`` is replaced by ``q = (1 - ε) · onehot(y) + ε / C`` over ``C`` classes,
    and the loss is ``-Σ_c q_c log p_c`` averaged over the positions whose target is not ``ignore_index``
    (the padding). With ``ε = 0`` this is the ordinary cross-entropy. The result equals
    ``F.cross_entropy(logits, target, label_smoothing=ε, ignore_index=ignore_index)``.

    Args:
        smoothing: ε in ``[0, 1)``; the paper uses 0.1.
        ignore_index: target value whose positions do not count (pass the padding id).

    Shape: ``forward(logits (N, C), target (N,)) -> scalar``; any leading dimensions ``(..., C)`` and ``(...)``
    are flattened.
    """

    def __init__(self, smoothing: float = 0.1, ignore_index: int = -100) -> None:
        super().__init__()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
        self.smoothing = float(smoothing)
        self.ignore_index = ignore_index

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if logits.shape[:-1] != target.shape:
            raise ValueError(f"logits (..., C) and target (...) disagree: got {tuple(logits.shape)} and "
                             f"{tuple(target.shape)}")
        logits, target = logits.reshape(-1, logits.size(-1)), target.reshape(-1)  # (N, C), (N,)
        log_probs = torch.log_softmax(logits, dim=-1)  # (N, C)
        keep = target != self.ignore_index  # (N,)
        safe_target = target.masked_fill(~keep, 0)  # any valid index; these rows are dropped below
        nll = -log_probs.gather(-1, safe_target[:, None])[:, 0]  # (N,): -log p_y
        uniform = -log_probs.mean(dim=-1)  # (N,): -(1/C) Σ_c log p_c
        per_token = (1.0 - self.smoothing) * nll + self.smoothing * uniform
        return per_token[keep].sum() / keep.sum().clamp(min=1)

    def extra_repr(self) -> str:
        return f"smoothing={self.smoothing}, ignore_index={self.ignore_index}"


# ----------------------------------------------------------------------------------------------------------
# Learning-rate schedule
# ----------------------------------------------------------------------------------------------------------
def warmup_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's learning rate at ``step`` (counted from 1): ``factor · d_model^-0.5 · min(step^-0.5,
    step · warmup^-1.5)``.

    It grows linearly for ``warmup`` steps, peaks at ``factor / √(d_model · warmup)``, then decays as
    ``1/√step``. The paper uses ``factor = 1`` and ``warmup = 4000`` with ``d_model = 512``.
    """
    for name, value in (("step", step), ("d_model", d_model), ("warmup", warmup)):
        check_int(name, value)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def noam_schedule(
    optimizer: torch.optim.Optimizer, d_model: int, warmup: int, factor: float = 1.0
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler that sets every parameter group's learning rate to :func:`warmup_lr` of the step.

    Call ``scheduler.step()`` after each ``optimizer.step()``. The optimizer's own ``lr`` is overridden (the
    scheduler divides by it, so any positive value works). Named after Noam Shazeer, as in the Annotated
    Transformer.
    """
    warmup_lr(1, d_model, warmup, factor)  # validates the arguments now, not at the first step
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    if any(lr <= 0 for lr in base_lrs):
        raise ValueError(f"the optimizer's learning rates must be positive, got {base_lrs}")
    lambdas = [lambda step, base=base: warmup_lr(step + 1, d_model, warmup, factor) / base for base in base_lrs]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)


def transformer_optimizer(
    model: nn.Module, d_model: int, warmup: int, factor: float = 1.0
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam with the paper's settings (β₁ = 0.9, β₂ = 0.98, ε = 1e-9) and the warm-up schedule."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=fused_adam(next(model.parameters()).device))
    return optimizer, noam_schedule(optimizer, d_model, warmup, factor)


# ----------------------------------------------------------------------------------------------------------
# One training step
# ----------------------------------------------------------------------------------------------------------
def teacher_forcing(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Split ``tgt (B, Lt)`` = ``[bos, y1, ..., yn, eos, pad...]`` into the decoder's input and its labels.

    Returns:
        ``(decoder_input, labels)``, both ``(B, Lt - 1)``: ``tgt[:, :-1]`` (starts with bos) and ``tgt[:, 1:]``
        (ends with eos). Position t of the decoder sees the true tokens up to t and must predict token t + 1.
    """
    if tgt.dim() != 2 or tgt.size(1) < 2:
        raise ValueError(f"tgt must be (batch, length >= 2) token ids framed by bos and eos, got {tuple(tgt.shape)}")
    return tgt[:, :-1], tgt[:, 1:]


def translation_masks(src: Tensor, decoder_input: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """The masks of one batch (True = may attend).

    Returns:
        ``(src_mask, tgt_mask)``: the source padding mask ``(B, 1, 1, Ls)``, used by the encoder's
        self-attention and by the decoder's cross-attention, and the causal mask ``(Lt, Lt)`` of the decoder's
        self-attention. Target padding needs no mask of its own: padding comes after eos, so the causal mask
        already hides it from every real position, and the loss ignores the padded positions themselves.
    """
    return padding_mask(src, pad_id), causal_mask(decoder_input.size(1), device=decoder_input.device)


def translation_loss(model: nn.Module, src: Tensor, tgt: Tensor, loss_fn: nn.Module, pad_id: int) -> Tensor:
    """Teacher-forced loss of one batch: ``src (B, Ls)``, ``tgt (B, Lt)`` framed by bos/eos -> scalar."""
    decoder_input, labels = teacher_forcing(tgt)  # (B, Lt-1) each
    src_mask, tgt_mask = translation_masks(src, decoder_input, pad_id)
    logits = model(src, decoder_input, src_mask, tgt_mask, src_mask)  # (B, Lt-1, V); memory mask = src mask
    return loss_fn(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def train_step(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    loss_fn: nn.Module,
    pad_id: int,
) -> float:
    """One optimisation step on one batch; returns the batch's loss (a Python float)."""
    model.train()
    loss = translation_loss(model, src, tgt, loss_fn, pad_id)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.item()


# ----------------------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------------------
@dataclass
class TrainingLog:
    """What :func:`train_translator` did: losses per step, scores per evaluation, time spent."""

    losses: list[float] = field(default_factory=list)
    evaluations: list[tuple[int, float]] = field(default_factory=list)  # (step, score)
    seconds: float = 0.0  # wall-clock time of the whole call, evaluations included
    eval_seconds: float = 0.0  # the part of it spent in evaluate()
    stopped_because: str = ""

    @property
    def steps(self) -> int:
        return len(self.losses)


def train_translator(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    pad_id: int,
    *,
    steps: int | None = None,
    time_budget: float | None = None,
    batch_size: int = 64,
    warmup: int = 200,
    lr_factor: float = 1.0,
    smoothing: float = 0.1,
    evaluate: Callable[[], float] | None = None,
    eval_every: int = 100,
    target: float | None = None,
    generator: torch.Generator | None = None,
    progress: Callable | None = None,
) -> TrainingLog:
    """Train ``model`` on ``(src (N, Ls), tgt (N, Lt))`` with :func:`train_step`, Adam and the warm-up schedule.

    Training stops at the first of: ``steps`` steps; ``time_budget`` seconds of wall-clock time (evaluations
    included); ``evaluate()`` returning at least ``target`` (checked every ``eval_every`` steps and at the end).

    Args:
        model: an encoder–decoder whose ``forward(src, tgt, src_mask, tgt_mask, memory_mask)`` gives logits,
            with a ``d_model`` attribute, already on the device of ``src``.
        src, tgt: the training set's token ids (see :func:`~attention_course.tasks.translation.encode_pairs`).
        pad_id: the padding id (ignored by the loss, masked in attention).
        batch_size, warmup, lr_factor, smoothing: the optimisation settings.
        evaluate: a function returning a score (e.g. validation exact match), called in eval mode.
        generator: the random source for shuffling (None: torch's global one).
        progress: e.g. ``tqdm.auto.tqdm``, to wrap the steps in a progress bar.

    Returns:
        A :class:`TrainingLog`.
    """
    if steps is None and time_budget is None:
        raise ValueError("give steps, time_budget or both, so that training ends")
    from attention_course.tasks.translation import batches  # local import: tasks depend on nothing here

    optimizer, scheduler = transformer_optimizer(model, model.d_model, warmup, lr_factor)
    loss_fn = LabelSmoothingLoss(smoothing, ignore_index=pad_id)
    log = TrainingLog()
    start = time.perf_counter()
    total = steps if steps is not None else 10**9
    counter = progress(range(total)) if progress is not None else range(total)
    epoch = iter(())

    def evaluate_now() -> bool:
        model.eval()
        eval_start = time.perf_counter()
        score = evaluate()
        log.eval_seconds += time.perf_counter() - eval_start
        log.evaluations.append((log.steps, score))
        return target is not None and score >= target

    for _ in counter:
        batch = next(epoch, None)
        if batch is None:  # start a new pass over the shuffled training set
            epoch = batches(src, tgt, batch_size, generator=generator)
            batch = next(epoch)
        log.losses.append(train_step(model, *batch, optimizer, scheduler, loss_fn, pad_id))
        if evaluate is not None and log.steps % eval_every == 0 and evaluate_now():
            log.stopped_because = "target"
            break
        if time_budget is not None and time.perf_counter() - start >= time_budget:
            log.stopped_because = "time"
            break
    else:
        log.stopped_because = "steps"
    if evaluate is not None and (not log.evaluations or log.evaluations[-1][0] != log.steps):
        evaluate_now()
    if hasattr(counter, "close"):
        counter.close()
    model.eval()
    log.seconds = time.perf_counter() - start
    return log


# ----------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------
def evaluate_translations(
    model: nn.Module,
    src: Tensor,
    references: Sequence[str],
    tgt_vocab,
    pad_id: int,
    beam_size: int = 1,
    max_len: int = 24,
    batch_size: int = 500,
) -> dict:
    """Translate ``src (N, Ls)`` and compare with the reference sentences.

    Args:
        model: the translator (put in eval mode here).
        src: source token ids; ``references``: the N reference translations as strings.
        tgt_vocab: the target :class:`~attention_course.tasks.translation.Vocabulary` (for bos/eos and decoding).
        pad_id: the source padding id.
        beam_size: 1 for greedy decoding, more for beam search.

    Returns:
        ``{"exact_match": fraction of sentences translated exactly, "bleu": corpus BLEU (0-100, sacrebleu's
        default 13a tokenisation), "hypotheses": the N translations}``.
    """
    import sacrebleu

    if src.size(0) != len(references):
        raise ValueError(f"got {src.size(0)} source sentences but {len(references)} references")
    model.eval()
    hypotheses: list[str] = []
    for start in range(0, src.size(0), batch_size):
        chunk = src[start : start + batch_size]
        if beam_size == 1:
            out = greedy_decode(model, chunk, max_len, tgt_vocab.bos_id, tgt_vocab.eos_id, pad_id=pad_id)
        else:
            out = beam_search(model, chunk, beam_size, max_len, tgt_vocab.bos_id, tgt_vocab.eos_id, pad_id=pad_id)
        hypotheses += [tgt_vocab.decode(row) for row in out.cpu()]
    exact = sum(h == r for h, r in zip(hypotheses, references)) / len(references)
    bleu = sacrebleu.corpus_bleu(hypotheses, [list(references)]).score
    return {"exact_match": exact, "bleu": bleu, "hypotheses": hypotheses}


@torch.no_grad()
def teacher_forced_exact_match(model: nn.Module, src: Tensor, tgt: Tensor, pad_id: int) -> float:
    """Fraction of sentences whose every next-token argmax is right when the decoder is fed the reference.

    This equals the exact match of :func:`~attention_course.decoding.greedy_decode` (at the token level): if
    the argmax after every reference prefix is the next reference token, greedy decoding, which always
    feeds back its own argmax, reproduces the reference up to its eos; if some argmax is wrong, greedy
    decoding makes that same mistake the first time it happens. One forward pass replaces ``Lt`` decoding
    steps, which makes it a cheap validation score during training.

    Args:
        model: the translator; src ``(N, Ls)`` and tgt ``(N, Lt)`` as from
            :func:`~attention_course.tasks.translation.encode_pairs`; pad_id: the padding id.
    """
    model.eval()
    decoder_input, labels = teacher_forcing(tgt)
    src_mask, tgt_mask = translation_masks(src, decoder_input, pad_id)
    predictions = model(src, decoder_input, src_mask, tgt_mask, src_mask).argmax(dim=-1)  # (N, Lt-1)
    correct = (predictions == labels) | (labels == pad_id)  # padding positions do not count
    return correct.all(dim=1).float().mean().item()
