"""Decoder-only translation: the joint sequences, the loss on target tokens only, and exact match."""

import torch

import attention_course as ac
from attention_course.prefix_translation import (
    SEP,
    encode_prefix_pairs,
    joint_vocabulary,
    prefix_exact_match,
    prefix_greedy_translate,
    train_prefix_translator,
)
from attention_course.tasks.translation import make_translation_data


def test_sequences_and_a_short_training_run():
    data = make_translation_data(seed=0, num_train=200, num_valid=20, num_test=20)
    vocab = joint_vocabulary(data.src_vocab, data.tgt_vocab)
    assert vocab.itos[:4] == ["<pad>", "<bos>", "<eos>", SEP]
    train = encode_prefix_pairs(data.train, vocab)
    first = data.train[0]
    row = vocab.tokens(train.tokens[0])
    prefix = int(train.prefix_lengths[0])
    assert row[prefix - 1] == SEP and " ".join(row[: prefix - 1]) == first.source
    assert " ".join(row[prefix:]).startswith(first.target + " <eos>")
    torch.manual_seed(0)
    model = ac.DecoderOnlyLM(len(vocab), d_model=16, num_heads=2, num_layers=1, max_len=40)
    before = prefix_exact_match(model, train, vocab.pad_id)
    log = train_prefix_translator(model, train, vocab.pad_id, steps=30, batch_size=32, warmup=10,
                                  generator=torch.Generator().manual_seed(0))
    assert log.losses[-1] < log.losses[0]
    assert before == 0.0 and 0.0 <= prefix_exact_match(model, train, vocab.pad_id) <= 1.0
    assert len(prefix_greedy_translate(model, [first.source], vocab)) == 1
