"""Greedy decoding and beam search: agreement with each other, with brute force, and eos handling."""

import itertools
import math

import pytest
import torch
from torch import Tensor, nn

from attention_course import Transformer
from attention_course.decoding import (
    beam_search,
    greedy_decode,
    length_penalty_factor,
    sequence_log_probs,
)
from attention_course.training import TorchTranslator

PAD, BOS, EOS = 0, 1, 2


def trim(row: list[int]) -> tuple[int, ...]:
    """A decoded row up to and including its first eos (the rest is filler)."""
    return tuple(row[: row.index(EOS) + 1]) if EOS in row else tuple(row)


def random_model(vocab: int = 12, seed: int = 0, cls=Transformer) -> nn.Module:
    torch.manual_seed(seed)
    model = cls(vocab, vocab, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=2, d_ff=32,
                dropout=0.1, max_len=32)
    return model.double().eval()


def random_source(batch: int = 5, length: int = 6, vocab: int = 12, seed: int = 1) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, vocab, (batch, length), generator=g)
    for row in range(1, batch):  # rows of different lengths: pad the tail
        src[row, length - row % length :] = PAD
    return src


class TableModel(nn.Module):
    """A fake encoder–decoder whose next-token log-probabilities are a fixed function of the prefix.

    ``table(prefix) -> (V,) logits``; the source only selects nothing here (the memory is a dummy), so the
    whole distribution over sequences is known and can be searched exhaustively.
    """

    def __init__(self, table) -> None:
        super().__init__()
        self.table = table

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return torch.zeros(src.size(0), src.size(1), 1, dtype=torch.float64)

    def decode(self, tgt: Tensor, memory: Tensor, tgt_mask=None, memory_mask=None) -> Tensor:
        assert torch.equal(tgt_mask, torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).tril())
        rows = [[self.table(tuple(row[: t + 1].tolist())) for t in range(tgt.size(1))] for row in tgt]
        return torch.stack([torch.stack(row) for row in rows])  # (B, t, V)


def hashed_logits(vocab: int, seed: int):
    """Pseudo-random logits per prefix, deterministic: a different distribution after every prefix."""

    def table(prefix: tuple[int, ...]) -> Tensor:
        g = torch.Generator().manual_seed(hash((seed, prefix)) % 2**31)
        return 2.0 * torch.randn(vocab, generator=g, dtype=torch.float64)

    return table


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_of_one_is_at_least_as_probable_as_greedy(seed):
    """The greedy path stays live in a beam of one; a finished hypothesis met on the way wins only if better."""
    model, src = random_model(seed=seed), random_source(seed=seed + 10)
    greedy = greedy_decode(model, src, max_len=10, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    beam = beam_search(model, src, beam_size=1, max_len=10, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    assert (beam[:, 0] == BOS).all() and beam.size(1) <= 11
    greedy_score = sequence_log_probs(model, src, greedy, EOS, pad_id=PAD)
    beam_score = sequence_log_probs(model, src, beam, EOS, pad_id=PAD)
    assert (beam_score >= greedy_score - 1e-9).all()
    for row in range(src.size(0)):  # same score means the same sequence
        if math.isclose(beam_score[row].item(), greedy_score[row].item(), abs_tol=1e-9):
            assert trim(beam[row].tolist()) == trim(greedy[row].tolist())


def test_beam_of_one_equals_greedy_when_greedy_meets_no_better_finished_hypothesis():
    # eos is never among the two best tokens before the greedy path ends: the beam of one is greedy.
    model = TableModel(scripted_table({(BOS,): {3: 0.6, 4: 0.3}, (BOS, 3): {4: 0.7, 3: 0.2},
                                       (BOS, 3, 4): {EOS: 0.8}}))
    src = torch.zeros(1, 2, dtype=torch.long)
    greedy = greedy_decode(model, src, 6, BOS, EOS, pad_id=PAD)
    assert torch.equal(beam_search(model, src, 1, 6, BOS, EOS, pad_id=PAD), greedy)
    assert greedy.tolist() == [[BOS, 3, 4, EOS]]


def test_beam_of_one_runs_the_torch_model_without_padding():
    model = random_model(seed=3, cls=TorchTranslator)
    src = random_source(seed=4)[:1]  # one unpadded sentence, no pad_id given
    greedy = greedy_decode(model, src, max_len=8, bos_id=BOS, eos_id=EOS)
    beam = beam_search(model, src, 1, 8, BOS, EOS)
    assert sequence_log_probs(model, src, beam, EOS) >= sequence_log_probs(model, src, greedy, EOS) - 1e-9


def test_greedy_on_a_batch_equals_greedy_one_sentence_at_a_time():
    model, src = random_model(seed=5), random_source(seed=6)
    batch = greedy_decode(model, src, max_len=9, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    for row in range(src.size(0)):
        length = int((src[row] != PAD).sum())
        alone = greedy_decode(model, src[row : row + 1, :length], max_len=9, bos_id=BOS, eos_id=EOS, pad_id=PAD)
        assert batch[row, : alone.size(1)].tolist() == alone[0].tolist()
        assert (batch[row, alone.size(1) :] == PAD).all()


def test_greedy_takes_the_argmax_at_every_step():
    model, src = random_model(seed=7), random_source(batch=3, seed=8)
    out = greedy_decode(model, src, max_len=6, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    memory = model.encode(src, (src != PAD)[:, None, None, :])
    for t in range(1, out.size(1)):
        logits = model.decode(out[:, :t], memory, torch.ones(t, t, dtype=torch.bool).tril(),
                              (src != PAD)[:, None, None, :])
        alive = ~(out[:, 1:t] == EOS).any(dim=1)
        assert torch.equal(out[alive, t], logits[alive, -1].argmax(-1))


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_search_scores_higher_than_greedy_on_the_whole(beam_size):
    """The best beam is usually at least as probable as the greedy output, and more probable on average.

    "Always" is not a theorem: the greedy prefix can be pruned from a narrow beam whose survivors later turn
    out worse (it happens here on untrained models, whose outputs run to max_len). The exhaustive test below
    checks the guarantee that does hold.
    """
    rows_at_least_as_good, total, gain = 0, 0, 0.0
    for seed in range(6):
        model, src = random_model(seed=seed), random_source(seed=seed + 20)
        greedy = greedy_decode(model, src, 10, BOS, EOS, pad_id=PAD)
        beam = beam_search(model, src, beam_size, 10, BOS, EOS, pad_id=PAD)
        greedy_score = sequence_log_probs(model, src, greedy, EOS, pad_id=PAD)
        beam_score = sequence_log_probs(model, src, beam, EOS, pad_id=PAD)
        rows_at_least_as_good += int((beam_score >= greedy_score - 1e-9).sum())
        total += src.size(0)
        gain += float((beam_score - greedy_score).sum())
    assert rows_at_least_as_good >= 0.8 * total, (rows_at_least_as_good, total)
    assert gain > 0


def all_sequences(vocab: int, max_len: int):
    """Every output the decoders can produce: ends at the first eos, or runs to max_len tokens."""
    for length in range(1, max_len + 1):
        for body in itertools.product([t for t in range(vocab) if t != EOS], repeat=length - 1):
            yield (BOS, *body, EOS)
        if length == max_len:
            for body in itertools.product([t for t in range(vocab) if t != EOS], repeat=length):
                yield (BOS, *body)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exhaustive_beam_finds_the_most_probable_sequence(seed):
    vocab, max_len = 4, 3
    model = TableModel(hashed_logits(vocab, seed))
    src = torch.zeros(1, 2, dtype=torch.long)

    def log_prob(sequence):
        total = 0.0
        for t in range(1, len(sequence)):
            total += torch.log_softmax(model.table(sequence[:t]), -1)[sequence[t]].item()
        return total

    best = max(all_sequences(vocab, max_len), key=log_prob)
    # No pad_id: the table model may emit token 0 as a word; eos fills the positions after eos.
    found = beam_search(model, src, beam_size=vocab**max_len, max_len=max_len, bos_id=BOS, eos_id=EOS)
    assert trim(found[0].tolist()) == best
    score = sequence_log_probs(model, src, found, EOS).item()
    assert math.isclose(score, log_prob(best), abs_tol=1e-9)
    greedy = greedy_decode(model, src, max_len, BOS, EOS)
    assert score >= sequence_log_probs(model, src, greedy, EOS).item() - 1e-12
    # A beam narrower than the search space may miss the best sequence, but never by exceeding it.
    narrow = beam_search(model, src, beam_size=2, max_len=max_len, bos_id=BOS, eos_id=EOS)
    assert sequence_log_probs(model, src, narrow, EOS).item() <= score + 1e-12


def scripted_table(script: dict[tuple[int, ...], dict[int, float]], vocab: int = 5):
    """Logits from a script: prefix -> {token: probability}; the rest of the mass spread evenly."""

    def table(prefix):
        probs = script.get(prefix, {EOS: 1.0})
        rest = (1.0 - sum(probs.values())) / (vocab - len(probs))
        p = torch.full((vocab,), max(rest, 1e-12), dtype=torch.float64)
        for token, value in probs.items():
            p[token] = value
        return p.log()

    return table


def test_eos_ends_each_sequence_and_pads_after_it():
    # Row 0 says eos at once; the other rows say 3, 4, eos. Decoding stops when all rows are done.
    model = TableModel(scripted_table({(BOS,): {3: 0.9}, (BOS, 3): {4: 0.9}, (BOS, 3, 4): {EOS: 0.9}}))
    out = greedy_decode(model, torch.zeros(2, 2, dtype=torch.long), max_len=10, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    assert out.tolist() == [[BOS, 3, 4, EOS]] * 2  # stopped after 3 tokens, not 10
    early = TableModel(scripted_table({(BOS,): {EOS: 0.9}}))
    out = greedy_decode(early, torch.zeros(1, 2, dtype=torch.long), 10, BOS, EOS, pad_id=PAD)
    assert out.tolist() == [[BOS, EOS]]
    # Without pad_id the positions after eos repeat eos; max_len cuts a sequence that never ends.
    never = TableModel(scripted_table({prefix: {3: 0.9} for prefix in [(BOS,) + (3,) * n for n in range(6)]}))
    out = greedy_decode(never, torch.zeros(1, 2, dtype=torch.long), 4, BOS, EOS)
    assert out.tolist() == [[BOS, 3, 3, 3, 3]]
    assert beam_search(never, torch.zeros(1, 2, dtype=torch.long), 3, 4, BOS, EOS).tolist() == [[BOS, 3, 3, 3, 3]]


def test_rows_finishing_at_different_steps_in_one_batch():
    model = random_model(seed=11)
    src = random_source(batch=6, seed=12)
    out = greedy_decode(model, src, max_len=12, bos_id=BOS, eos_id=EOS, pad_id=PAD)
    lengths = []
    for row in out.tolist():
        if EOS in row:  # everything after the first eos is padding
            assert all(token == PAD for token in row[row.index(EOS) + 1 :])
            lengths.append(row.index(EOS))
        else:
            lengths.append(12)
    assert out.size(1) == max(lengths) + 1  # decoding ran exactly until the last row finished
    assert len(set(lengths)) > 1  # the rows did finish at different steps


def normalised(model, sequence, alpha):
    """log p(sequence) / lp(length), the score beam search compares; length counts tokens after bos."""
    total = 0.0
    for t in range(1, len(sequence)):
        total += torch.log_softmax(model.table(sequence[:t]), -1)[sequence[t]].item()
    return total / length_penalty_factor(len(sequence) - 1, alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_wide_beam_matches_exhaustive_search_with_a_length_penalty(seed, alpha):
    vocab, max_len = 4, 4
    model = TableModel(hashed_logits(vocab, seed))
    src = torch.zeros(1, 2, dtype=torch.long)
    best = max(all_sequences(vocab, max_len), key=lambda seq: normalised(model, seq, alpha))
    found = beam_search(model, src, vocab**max_len, max_len, BOS, EOS, length_penalty=alpha)
    assert trim(found[0].tolist()) == best
    # A narrow beam never exceeds the optimum.
    narrow = beam_search(model, src, 2, max_len, BOS, EOS, length_penalty=alpha)
    assert normalised(model, trim(narrow[0].tolist()), alpha) <= normalised(model, best, alpha) + 1e-12


def exhaustive_best(model, max_len, alpha):
    """The output with the best normalised score, by visiting every prefix once (depth first)."""
    best, best_score = None, -math.inf
    stack = [((BOS,), 0.0)]
    while stack:
        prefix, total = stack.pop()
        log_probs = torch.log_softmax(model.table(prefix), -1).tolist()
        for token, log_p in enumerate(log_probs):
            sequence, score = prefix + (token,), total + log_p
            length = len(sequence) - 1
            if token == EOS or length == max_len:  # finished, or cut at max_len
                if score / length_penalty_factor(length, alpha) > best_score:
                    best, best_score = sequence, score / length_penalty_factor(length, alpha)
            else:
                stack.append((sequence, score))
    return best


def long_better_toy():
    """The toy of issue 15: <eos> at once (p = 0.4) against a^7 <eos>, less probable but longer.

    After bos: eos 0.40, a 0.59. After a: eos 0.50, a 0.481 (so "a eos" beats "a a" on raw log-probability).
    After a^2 ... a^6: a 0.979. After a^7: eos 0.979.
    """
    a = 3
    script = {(BOS,): {EOS: 0.40, a: 0.59}, (BOS, a): {EOS: 0.50, a: 0.481}}
    for n in range(2, 7):
        script[(BOS,) + (a,) * n] = {a: 0.979}
    script[(BOS,) + (a,) * 7] = {EOS: 0.979}
    return TableModel(scripted_table(script, vocab=4)), (BOS,) + (a,) * 7 + (EOS,)


def test_finished_hypotheses_do_not_take_live_slots():
    model, long = long_better_toy()
    src = torch.zeros(1, 2, dtype=torch.long)
    assert model.table((BOS,)).numel() == 4  # pad, bos, eos, a
    assert math.isclose(normalised(model, (BOS, EOS), 0.6), -0.916, abs_tol=5e-4)
    assert math.isclose(normalised(model, long, 0.6), -0.872, abs_tol=5e-4)
    # A search whose finished hypotheses compete for the k = 2 slots on raw log-probability keeps
    # "<eos>" and "a <eos>" after two steps, stops, and returns "<eos>" (-0.916). The live beam
    # keeps "a a" instead and reaches a^7 <eos> (-0.872).
    found = beam_search(model, src, 2, 12, BOS, EOS, pad_id=PAD, length_penalty=0.6)
    assert trim(found[0].tolist()) == long
    # The same toy searched exhaustively (every output of up to 9 tokens) agrees.
    assert exhaustive_best(model, 9, 0.6) == long
    # Without the length penalty the most probable output is the short one, and the search finds it.
    plain = beam_search(model, src, 2, 12, BOS, EOS, pad_id=PAD, length_penalty=0.0)
    assert trim(plain[0].tolist()) == (BOS, EOS)


def test_search_stops_when_no_live_prefix_can_win():
    """After <eos> (p = 0.9) no live prefix can catch up: the search stops at once, not at max_len."""
    calls = []

    def table(prefix):
        calls.append(prefix)
        return scripted_table({(BOS,): {EOS: 0.9}}, vocab=5)(prefix)

    model = TableModel(table)
    out = beam_search(model, torch.zeros(1, 2, dtype=torch.long), 3, 50, BOS, EOS, pad_id=PAD)
    assert out.tolist() == [[BOS, EOS]]
    assert max(len(prefix) for prefix in calls) <= 2


def test_length_penalty_reranks_finished_hypotheses():
    # Short: [eos] with p = 0.5. Long: [3, eos] with p = 0.45 * 0.9 = 0.405.
    model = TableModel(scripted_table({(BOS,): {EOS: 0.5, 3: 0.45}, (BOS, 3): {EOS: 0.9}}))
    src = torch.zeros(1, 2, dtype=torch.long)
    short = beam_search(model, src, 2, 5, BOS, EOS, pad_id=PAD, length_penalty=0.0)
    assert trim(short[0].tolist()) == (BOS, EOS)
    # lp(1) = 1, lp(2) = (7/6)^5 = 2.16: log(0.405)/2.16 = -0.42 beats log(0.5) = -0.69.
    long = beam_search(model, src, 2, 5, BOS, EOS, pad_id=PAD, length_penalty=5.0)
    assert trim(long[0].tolist()) == (BOS, 3, EOS)


def test_sequence_log_probs_sums_the_token_log_probs_up_to_eos():
    model, src = random_model(seed=13), random_source(batch=2, seed=14)
    tokens = torch.tensor([[BOS, 5, 6, EOS, PAD, PAD], [BOS, 7, EOS, 9, 9, 9]])
    mask = (src != PAD)[:, None, None, :]
    logits = model.decode(tokens[:, :-1], model.encode(src, mask), torch.ones(5, 5, dtype=torch.bool).tril(), mask)
    log_probs = torch.log_softmax(logits, -1)
    expected = torch.stack([
        log_probs[0, 0, 5] + log_probs[0, 1, 6] + log_probs[0, 2, EOS],
        log_probs[1, 0, 7] + log_probs[1, 1, EOS],
    ])
    torch.testing.assert_close(sequence_log_probs(model, src, tokens, EOS, pad_id=PAD), expected)


def test_decoding_leaves_the_batch_independent_of_beam_width_per_row():
    """Beam search on a batch returns, per row, what it returns for that row alone."""
    model, src = random_model(seed=15), random_source(batch=4, seed=16)
    batch = beam_search(model, src, 3, 8, BOS, EOS, pad_id=PAD, length_penalty=0.6)
    for row in range(src.size(0)):
        length = int((src[row] != PAD).sum())
        alone = beam_search(model, src[row : row + 1, :length], 3, 8, BOS, EOS, pad_id=PAD, length_penalty=0.6)
        assert batch[row, : alone.size(1)].tolist() == alone[0].tolist()


def test_bad_arguments_raise():
    model, src = random_model(), random_source()
    with pytest.raises(ValueError, match="src must be"):
        greedy_decode(model, src[0], 5, BOS, EOS)
    with pytest.raises(TypeError, match="integer"):
        greedy_decode(model, src.float(), 5, BOS, EOS)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, src, 0, BOS, EOS)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, 0, 5, BOS, EOS)
    with pytest.raises(ValueError, match="length_penalty"):
        beam_search(model, src, 2, 5, BOS, EOS, length_penalty=-1.0)
    with pytest.raises(ValueError, match="tokens must be"):
        sequence_log_probs(model, src, torch.ones(2, 3, dtype=torch.long), EOS)
