"""Training pieces: label smoothing vs PyTorch, the warm-up schedule, teacher forcing, one step, the loop,
the PyTorch reference translator, and the evaluation of translations."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention_course import Decoder, Encoder, Transformer, count_parameters
from attention_course.decoding import greedy_decode
from attention_course.training import (
    LabelSmoothingLoss,
    TorchTranslator,
    evaluate_translations,
    noam_schedule,
    teacher_forced_exact_match,
    teacher_forcing,
    train_step,
    train_translator,
    transformer_optimizer,
    translation_loss,
    translation_masks,
    warmup_lr,
)

PAD, BOS, EOS = 0, 1, 2


# ----------------------------------------------------------------------------------------------------------
# Label smoothing
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_label_smoothing_equals_torch_cross_entropy_values_and_gradients(smoothing):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 11, (4, 7), generator=g)
    target[0, 3:] = PAD  # padded positions must not count
    ours = LabelSmoothingLoss(smoothing, ignore_index=PAD)(logits, target)
    (ours_grad,) = torch.autograd.grad(ours, logits)
    reference = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), label_smoothing=smoothing,
                                ignore_index=PAD)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)
    assert (ours_grad[0, 3:] == 0).all()  # no gradient through padding


def test_smoothed_loss_is_minimised_by_the_smoothed_distribution():
    """The loss is -Σ q log p, minimised when p = q = (1 - ε) onehot + ε/C; its minimum is the entropy of q."""
    classes, eps = 5, 0.2
    q = torch.full((classes,), eps / classes, dtype=torch.float64)
    q[3] += 1 - eps
    loss = LabelSmoothingLoss(eps)
    at_q = loss(q.log()[None], torch.tensor([3]))
    torch.testing.assert_close(at_q, -(q * q.log()).sum())
    confident = torch.full((classes,), -20.0, dtype=torch.float64)
    confident[3] = 20.0
    assert loss(confident[None], torch.tensor([3])) > at_q + 1.0  # over-confidence is punished
    assert LabelSmoothingLoss(0.0)(confident[None], torch.tensor([3])) < 1e-10  # but not without smoothing


def test_label_smoothing_bad_input():
    with pytest.raises(ValueError, match="smoothing"):
        LabelSmoothingLoss(1.0)
    with pytest.raises(ValueError, match="disagree"):
        LabelSmoothingLoss(0.1)(torch.randn(3, 5), torch.zeros(4, dtype=torch.long))


# ----------------------------------------------------------------------------------------------------------
# Learning-rate schedule
# ----------------------------------------------------------------------------------------------------------
def test_warmup_lr_rises_linearly_peaks_then_decays_as_inverse_sqrt():
    d, warmup = 512, 4000
    peak = warmup_lr(warmup, d, warmup)
    assert math.isclose(peak, 1 / math.sqrt(d * warmup))
    assert math.isclose(warmup_lr(1000, d, warmup), peak * 1000 / warmup)  # linear during warm-up
    assert math.isclose(warmup_lr(4 * warmup, d, warmup), peak / 2)  # 1/√step after it
    assert max(warmup_lr(s, d, warmup) for s in range(1, 3 * warmup)) == peak
    assert math.isclose(warmup_lr(100, 64, 10, factor=2.0), 2 * warmup_lr(100, 64, 10))
    with pytest.raises(ValueError, match="step"):
        warmup_lr(0, d, warmup)


def test_noam_schedule_drives_the_optimizer_learning_rate():
    model = nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = noam_schedule(optimizer, d_model=16, warmup=5)
    seen = []
    for _ in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    expected = [warmup_lr(step, 16, 5) for step in range(1, 13)]
    assert all(math.isclose(a, b) for a, b in zip(seen, expected)), (seen, expected)
    adam, _ = transformer_optimizer(model, 16, 5)
    assert adam.defaults["betas"] == (0.9, 0.98) and adam.defaults["eps"] == 1e-9


# ----------------------------------------------------------------------------------------------------------
# Teacher forcing, masks, one step
# ----------------------------------------------------------------------------------------------------------
def test_teacher_forcing_shifts_by_one():
    tgt = torch.tensor([[BOS, 5, 6, 7, EOS], [BOS, 8, EOS, PAD, PAD]])
    decoder_input, labels = teacher_forcing(tgt)
    assert decoder_input.tolist() == [[BOS, 5, 6, 7], [BOS, 8, EOS, PAD]]
    assert labels.tolist() == [[5, 6, 7, EOS], [8, EOS, PAD, PAD]]
    src_mask, tgt_mask = translation_masks(torch.tensor([[4, 4, EOS], [4, EOS, PAD]]), decoder_input, PAD)
    assert src_mask.shape == (2, 1, 1, 3) and src_mask[1, 0, 0].tolist() == [True, True, False]
    assert torch.equal(tgt_mask, torch.ones(4, 4, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="tgt must be"):
        teacher_forcing(torch.tensor([[BOS]]))


def tiny_model(cls=Transformer, seed=0, dropout=0.0):
    torch.manual_seed(seed)
    return cls(9, 10, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32,
               dropout=dropout, max_len=16)


def copy_batch():
    src = torch.tensor([[3, 4, 5, EOS], [6, 7, EOS, PAD]])
    tgt = torch.tensor([[BOS, 3, 4, 5, EOS], [BOS, 6, 7, EOS, PAD]])
    return src, tgt


def test_translation_loss_ignores_what_follows_each_position():
    """Changing a later target token changes no earlier position's loss: the causal mask works in training."""
    model = tiny_model().eval()
    src, tgt = copy_batch()
    loss_fn = LabelSmoothingLoss(0.0, ignore_index=PAD)

    def per_position(tgt):
        decoder_input, labels = teacher_forcing(tgt)
        src_mask, tgt_mask = translation_masks(src, decoder_input, PAD)
        logits = model(src, decoder_input, src_mask, tgt_mask, src_mask)
        return F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # (B, Lt-1)

    changed = tgt.clone()
    changed[0, 3] = 8  # the third French word of sentence 0
    before, after = per_position(tgt), per_position(changed)
    torch.testing.assert_close(before[0, :2], after[0, :2])  # positions 0, 1 predict tokens 1, 2: unaffected
    assert not torch.allclose(before[0, 2:], after[0, 2:])
    labels = teacher_forcing(tgt)[1]
    torch.testing.assert_close(translation_loss(model, src, tgt, loss_fn, PAD), before[labels != PAD].mean())


def test_train_step_lowers_the_loss_on_a_repeated_batch():
    model = tiny_model()
    src, tgt = copy_batch()
    optimizer, scheduler = transformer_optimizer(model, 16, warmup=10)
    loss_fn = LabelSmoothingLoss(0.1, ignore_index=PAD)
    losses = [train_step(model, src, tgt, optimizer, scheduler, loss_fn, PAD) for _ in range(40)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert model.training


def test_train_translator_stops_on_target_steps_and_needs_a_budget():
    model = tiny_model()
    src, tgt = copy_batch()
    src, tgt = src.repeat(8, 1), tgt.repeat(8, 1)
    calls = []

    def evaluate():
        calls.append(model.training)
        return 1.0

    log = train_translator(model, src, tgt, PAD, steps=50, batch_size=4, evaluate=evaluate, eval_every=5, target=1.0)
    assert log.steps == 5 and log.stopped_because == "target" and log.evaluations == [(5, 1.0)]
    assert calls == [False]  # evaluated in eval mode
    log = train_translator(model, src, tgt, PAD, steps=7, batch_size=4, generator=torch.Generator().manual_seed(0))
    assert log.steps == 7 and log.stopped_because == "steps" and len(log.losses) == 7 and not model.training
    log = train_translator(model, src, tgt, PAD, time_budget=0.0, batch_size=4)
    assert log.steps == 1 and log.stopped_because == "time"
    with pytest.raises(ValueError, match="budget"):
        train_translator(model, src, tgt, PAD)


# ----------------------------------------------------------------------------------------------------------
# The PyTorch reference translator
# ----------------------------------------------------------------------------------------------------------
def library_copy_of(reference: TorchTranslator) -> Transformer:
    """A library Transformer with ``reference``'s weights (embeddings, layers, output projection)."""
    model = Transformer(reference.src_embedding.num_embeddings, reference.generator.out_features,
                        d_model=reference.d_model, num_heads=reference.encoder.layers[0].self_attn.num_heads,
                        num_encoder_layers=len(reference.encoder.layers),
                        num_decoder_layers=len(reference.decoder.layers),
                        d_ff=reference.encoder.layers[0].linear1.out_features, dropout=0.0, max_len=16)
    model.encoder = Encoder.from_torch(reference.encoder)
    model.decoder = Decoder.from_torch(reference.decoder)
    model.load_state_dict({**model.state_dict(), **{
        name: value for name, value in reference.state_dict().items()
        if name.split(".")[0] in ("src_embedding", "tgt_embedding", "generator")
    }})
    return model


def test_torch_translator_equals_the_library_model_with_copied_weights():
    reference = tiny_model(TorchTranslator, seed=3, dropout=0.1).eval()
    model = library_copy_of(reference).eval()
    assert count_parameters(model) == count_parameters(reference)
    src, tgt = copy_batch()
    decoder_input, _ = teacher_forcing(tgt)
    src_mask, tgt_mask = translation_masks(src, decoder_input, PAD)
    expected = reference(src, decoder_input, src_mask, tgt_mask, src_mask)
    torch.testing.assert_close(model(src, decoder_input, src_mask, tgt_mask, src_mask), expected, atol=1e-5, rtol=0)
    # Without the masks the answer changes (so the masks above were really used and converted correctly).
    assert not torch.allclose(reference(src, decoder_input), expected, atol=1e-3)


def test_torch_translator_rejects_masks_it_cannot_convert():
    reference = tiny_model(TorchTranslator)
    src, tgt = copy_batch()
    with pytest.raises(ValueError, match="padding mask"):
        reference.encode(src, torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="causal mask"):
        reference.decode(tgt, reference.encode(src), torch.ones(2, 1, 5, 5, dtype=torch.bool))


# ----------------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------------
class OracleModel(nn.Module):
    """Decodes the stored reference of each sentence: the source's first token is the sentence's row number."""

    def __init__(self, targets: Tensor, vocab: int) -> None:
        super().__init__()
        self.targets, self.vocab = targets, vocab

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return src[:, :1, None].float()  # (B, 1, 1): the row number

    def decode(self, tgt: Tensor, memory: Tensor, tgt_mask=None, memory_mask=None) -> Tensor:
        rows = memory[:, 0, 0].long()
        padded = torch.cat([self.targets, torch.full_like(self.targets, PAD)], dim=1)
        following = padded[rows, 1 : tgt.size(1) + 1]  # (B, t): the reference token after each position
        return F.one_hot(following, self.vocab).float() * 10.0


class Words:
    """A minimal target vocabulary for the oracle."""

    bos_id, eos_id = BOS, EOS
    itos = ["<pad>", "<bos>", "<eos>", "le", "chat", "noir", "la", "souris", "a", "vu"]

    def decode(self, ids) -> str:
        words = []
        for index in ids.tolist():
            if index == EOS:
                break
            if index not in (PAD, BOS):
                words.append(self.itos[index])
        return " ".join(words)


def test_evaluate_translations_exact_match_and_bleu():
    targets = torch.tensor([
        [BOS, 3, 4, 5, 8, 9, 6, 7, EOS],
        [BOS, 6, 7, 8, 9, 3, 4, EOS, PAD],
        [BOS, 3, 4, 8, 9, 6, 7, EOS, PAD],
    ])
    src = torch.tensor([[0, 9], [1, 9], [2, 9]])
    references = ["le chat noir a vu la souris", "la souris a vu le chat", "le chat a vu la souris"]
    model = OracleModel(targets, 10)
    perfect = evaluate_translations(model, src, references, Words(), pad_id=PAD)
    assert perfect["exact_match"] == 1.0 and perfect["hypotheses"] == references
    assert math.isclose(perfect["bleu"], 100.0)
    wrong_reference = [*references[:2], "le chat noir a vu la souris"]
    one_wrong = evaluate_translations(model, src, wrong_reference, Words(), PAD, beam_size=2, batch_size=2)
    assert math.isclose(one_wrong["exact_match"], 2 / 3) and 50.0 < one_wrong["bleu"] < 100.0
    with pytest.raises(ValueError, match="references"):
        evaluate_translations(model, src, references[:2], Words(), PAD)


def test_teacher_forced_exact_match_equals_greedy_exact_match():
    """Where the references are the model's own greedy outputs it scores 1, and a one-token change scores 0."""
    model = tiny_model(seed=4).eval()
    g = torch.Generator().manual_seed(5)
    src = torch.randint(3, 9, (6, 5), generator=g)
    src[3:, 3:] = PAD
    greedy = greedy_decode(model, src, max_len=6, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    assert teacher_forced_exact_match(model, src, greedy, PAD) == 1.0
    altered = greedy.clone()
    for row in (0, 1):  # change one generated token (before its eos): the argmax at that position no longer matches
        altered[row, 2] = 3 if altered[row, 2] != 3 else 4
    assert (altered[:2, 1:3] != EOS).all() and (greedy[:2, 1:3] != EOS).all()
    assert math.isclose(teacher_forced_exact_match(model, src, altered, PAD), 4 / 6, abs_tol=1e-6)
