"""The GRU encoder–decoder of chapter 1, with and without additive attention."""

import pytest
import torch

from attention_course.additive import AdditiveAttention
from attention_course.rnn import GRUEncoder, Seq2SeqGRU, sequence_accuracy, source_lengths, train_seq2seq
from attention_course.tasks.sequences import BOS, EOS, PAD, make_sequence_task

VOCAB = 9


def _source(lengths: list[int], generator: torch.Generator) -> torch.Tensor:
    """Right-padded random token ids (3..VOCAB-1) with the given lengths."""
    src = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for row, length in enumerate(lengths):
        src[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
    return src


def _model(attention: bool, seed: int = 0) -> Seq2SeqGRU:
    torch.manual_seed(seed)
    return Seq2SeqGRU(VOCAB, VOCAB + 2, hidden_dim=16, attention=attention, embed_dim=8).double().eval()


@pytest.mark.parametrize("attention", [True, False])
def test_forward_shapes(attention):
    g = torch.Generator().manual_seed(0)
    model = _model(attention)
    src = _source([5, 3, 1], g)
    tgt_in = torch.randint(0, VOCAB + 2, (3, 4), generator=g)
    logits, weights = model(src, tgt_in)
    assert logits.shape == (3, 4, VOCAB + 2)
    assert model.uses_attention is attention
    if attention:
        assert weights.shape == (3, 4, 5)
    else:
        assert weights is None


def test_attention_weights_are_distributions_over_real_tokens():
    g = torch.Generator().manual_seed(1)
    model = _model(True)
    src = _source([6, 2, 4], g)
    _, weights = model(src, torch.randint(0, VOCAB + 2, (3, 5), generator=g))
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 5, dtype=torch.float64))
    assert (weights >= 0).all()
    padding = (src == PAD).unsqueeze(1).expand_as(weights)
    assert (weights[padding] == 0).all(), "attention leaked onto padding positions"


def test_attend_equals_the_library_additive_attention():
    """The decoder projects the keys once per source; the result must be AdditiveAttention's, exactly."""
    g = torch.Generator().manual_seed(2)
    model = _model(True)
    src = _source([5, 2, 4], g)
    memory = model.encode(src)
    state = torch.randn(3, 16, generator=g, dtype=torch.float64)
    context, weights = model.decoder.attend(state, memory)
    attention: AdditiveAttention = model.decoder.attention
    expected_context, expected_weights = attention(state.unsqueeze(1), memory.states, memory.states,
                                                   memory.mask.unsqueeze(1))
    torch.testing.assert_close(weights, expected_weights.squeeze(1), rtol=0, atol=1e-12)
    torch.testing.assert_close(context, expected_context.squeeze(1), rtol=0, atol=1e-12)


def test_encoder_ignores_padding():
    """A sequence encoded alone and encoded next to a longer one gets the same states and summary."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(0)
    encoder = GRUEncoder(VOCAB, 8, 16).double()
    short = _source([3], g)
    batch = torch.cat([torch.nn.functional.pad(short, (0, 4), value=PAD), _source([7], g)])
    alone_states, alone_summary = encoder(short)
    batch_states, batch_summary = encoder(batch)
    torch.testing.assert_close(batch_states[0, :3], alone_states[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(batch_summary[0], alone_summary[0], rtol=0, atol=1e-12)
    assert (batch_states[0, 3:] == 0).all()
    # The summary is the forward pass's last state next to the backward pass's state at the first token.
    hidden = 16
    torch.testing.assert_close(alone_summary[0, :hidden], alone_states[0, -1, :hidden])
    torch.testing.assert_close(alone_summary[0, hidden:], alone_states[0, 0, hidden:])


def test_without_attention_the_decoder_sees_only_the_summary():
    """The bottleneck: changing the encoder states but not the summary changes nothing without attention."""
    g = torch.Generator().manual_seed(4)
    src = _source([6, 6], g)
    tgt_in = torch.randint(0, VOCAB + 2, (2, 5), generator=g)
    for attention, should_change in ((False, False), (True, True)):
        model = _model(attention)
        memory = model.encode(src)
        logits, _ = model.decoder(tgt_in, memory)
        scrambled = memory._replace(states=torch.randn_like(memory.states))
        if attention:
            scrambled = scrambled._replace(projected_keys=model.decoder.attention.w_k(scrambled.states))
        scrambled_logits, _ = model.decoder(tgt_in, scrambled)
        changed = not torch.allclose(logits, scrambled_logits)
        assert changed is should_change, f"attention={attention}: logits changed={changed}"


@pytest.mark.parametrize("attention", [True, False])
def test_greedy_decode_agrees_with_teacher_forcing_on_its_own_output(attention):
    g = torch.Generator().manual_seed(5)
    model = _model(attention)
    src = _source([5, 3, 4, 1], g)
    tokens, weights = model.greedy_decode(src, max_len=6, bos_id=BOS, eos_id=EOS)
    assert (tokens[:, 0] == BOS).all(), "rows start with <bos>, as decoding.greedy_decode's do"
    tokens = tokens[:, 1:]
    assert tokens.shape[0] == 4 and 1 <= tokens.shape[1] <= 6
    tgt_in = torch.cat([torch.full((4, 1), BOS), tokens[:, :-1]], dim=1)
    logits, forced_weights = model(src, tgt_in)
    for row in range(4):
        ends = (tokens[row] == EOS).nonzero()
        stop = int(ends[0]) + 1 if len(ends) else tokens.shape[1]
        assert torch.equal(logits[row, :stop].argmax(-1), tokens[row, :stop])
        assert (tokens[row, stop:] == PAD).all(), "tokens after EOS must be padding"
        if attention:
            torch.testing.assert_close(weights[row, :stop], forced_weights[row, :stop])
            assert (weights[row, stop:] == 0).all()
    assert (weights is None) is (not attention)


def test_greedy_decode_stops_at_eos():
    """A decoder whose output layer always prefers EOS stops after one step."""
    model = _model(True)
    with torch.no_grad():
        model.decoder.output.weight.zero_()
        model.decoder.output.bias.zero_()
        model.decoder.output.bias[EOS] = 5.0
    tokens, weights = model.greedy_decode(_source([4, 2], torch.Generator().manual_seed(6)), 10, BOS, EOS)
    assert tokens.tolist() == [[BOS, EOS], [BOS, EOS]]
    assert weights.shape == (2, 1, 4)


def test_bad_input_raises():
    model = _model(True)
    good = torch.tensor([[3, 4, 5], [6, 7, PAD]])
    tgt = torch.tensor([[BOS, 3], [BOS, 4]])
    with pytest.raises(ValueError, match="right-padded"):
        model(torch.tensor([[3, 4, 5], [PAD, 6, 7]]), tgt)
    with pytest.raises(ValueError, match="all padding"):
        model(torch.tensor([[3, 4], [PAD, PAD]]), tgt)
    with pytest.raises(TypeError, match="integer token ids"):
        model(good.float(), tgt)
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 9\)"):
        model(torch.tensor([[3, 9, 5], [6, 7, PAD]]), tgt)
    with pytest.raises(ValueError, match="batch size"):
        model(good, tgt[:1])
    with pytest.raises(ValueError, match="max_len"):
        model.greedy_decode(good, 0, BOS, EOS)
    with pytest.raises(ValueError, match="eos_id"):
        model.greedy_decode(good, 5, BOS, 99)
    with pytest.raises(TypeError, match="attention must be True or False"):
        Seq2SeqGRU(5, 5, attention="yes")
    with pytest.raises(ValueError, match="hidden_dim"):
        Seq2SeqGRU(5, 5, hidden_dim=0)


def test_source_lengths():
    assert source_lengths(torch.tensor([[3, 4, 0], [5, 0, 0], [6, 7, 8]]), PAD).tolist() == [2, 1, 3]


def test_sequence_accuracy():
    target = torch.tensor([[3, 4, EOS, PAD], [5, 6, 7, EOS]])
    predicted = torch.tensor([[3, 5, EOS], [5, 6, 7]])  # row 0: one wrong token; row 1: stops before its EOS
    token_accuracy, exact = sequence_accuracy(predicted, target)
    torch.testing.assert_close(token_accuracy, torch.tensor([2 / 3, 3 / 4]))
    assert exact.tolist() == [False, False]
    token_accuracy, exact = sequence_accuracy(torch.tensor([[3, 4, EOS, 9, 9], [5, 6, 7, EOS, PAD]]), target)
    assert token_accuracy.tolist() == [1.0, 1.0] and exact.tolist() == [True, True]
    with pytest.raises(ValueError, match="same N"):
        sequence_accuracy(predicted[:1], target)


@pytest.fixture
def one_thread():
    """Tiny models train faster on one thread: a second one mostly waits, and on a busy machine it spins."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_training_with_the_fused_adam_follows_the_per_parameter_loop(one_thread, monkeypatch):
    """On a CPU train_seq2seq asks for the fused Adam; its losses are those of PyTorch's default loop."""
    from attention_course import rnn

    data = make_sequence_task(256, 2, 4, task="reverse", seed=0)
    runs = {}
    for fused in (True, None):
        monkeypatch.setattr(rnn, "fused_adam", lambda device, fused=fused: fused)
        torch.manual_seed(0)
        model = Seq2SeqGRU(data.vocab_size, data.vocab_size, hidden_dim=16, attention=True)
        runs[fused] = torch.tensor(train_seq2seq(model, data.src, data.tgt_in, data.tgt_out, steps=30,
                                                 batch_size=32, lr=1e-2, progress=False))
    assert runs[True][-5:].mean() < 0.8 * runs[True][:5].mean()  # it trained
    torch.testing.assert_close(runs[True], runs[None], rtol=1e-4, atol=1e-4)


def test_training_reduces_the_loss(one_thread):
    torch.manual_seed(0)
    data = make_sequence_task(256, 2, 4, task="reverse", seed=0)
    model = Seq2SeqGRU(data.vocab_size, data.vocab_size, hidden_dim=16, attention=True)
    losses = train_seq2seq(model, data.src, data.tgt_in, data.tgt_out, steps=40, batch_size=32, lr=1e-2,
                           progress=False)
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.6 * first, f"loss went from {first:.3f} to only {last:.3f}"
    assert not model.training, "train_seq2seq must leave the model in eval mode"
    with pytest.raises(ValueError, match="batch_size"):
        train_seq2seq(model, data.src, data.tgt_in, data.tgt_out, steps=1, batch_size=1000, progress=False)
    with pytest.raises(ValueError, match="same number of examples"):
        train_seq2seq(model, data.src[:10], data.tgt_in, data.tgt_out, steps=1, progress=False)
