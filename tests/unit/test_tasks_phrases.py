"""The English→French phrase set of chapter 1."""

import pytest
import torch

from attention_course.tasks import phrases
from attention_course.tasks.phrases import (
    ADJECTIVES,
    NOUNS,
    VERBS,
    all_english_sentences,
    make_phrase_split,
    translate,
)
from attention_course.tasks.sequences import BOS, EOS, NUM_SPECIAL, PAD


@pytest.mark.parametrize(
    "english, french",
    [
        ("the black cat ate the white mouse", "le chat noir a mangé la souris blanche"),
        ("the mouse sees the grey cow", "la souris voit la vache grise"),
        ("the red hen chases the dog", "la poule rouge chasse le chien"),
        ("the fox likes the blue goat", "le renard aime la chèvre bleue"),
    ],
)
def test_translate_examples(english, french):
    assert translate(english) == french


def test_every_translation_inverts_and_agrees():
    """Rules checked on all 35,280 sentences: article and adjective agree with the noun, adjective after noun."""
    feminine_nouns = {fr for fr, gender in NOUNS.values() if gender == "f"}
    adjective_forms = {form: index for pair in ADJECTIVES.values() for index, form in enumerate(pair)}
    sentences = all_english_sentences()
    assert len(sentences) == len(set(sentences)) == (len(NOUNS) * (len(ADJECTIVES) + 1)) ** 2 * len(VERBS)
    for english in sentences[::7]:
        words, french = english.split(), translate(english).split()
        assert len(french) == len(words) + (1 if "ate" in words else 0)
        for i, word in enumerate(french):
            if word in ("le", "la"):
                noun = french[i + 1]
                assert (word == "la") == (noun in feminine_nouns), english
            if word in adjective_forms:
                assert french[i - 1] in {fr for fr, _ in NOUNS.values()}, f"adjective before its noun: {english}"
                if word != "rouge":  # the same word for both genders
                    assert (adjective_forms[word] == 1) == (french[i - 1] in feminine_nouns), english


def test_split_is_disjoint_deterministic_and_decodes_back():
    train, test = make_phrase_split(300, 100, seed=4)
    again, _ = make_phrase_split(300, 100, seed=4)
    other, _ = make_phrase_split(300, 100, seed=5)
    assert len(train) == 300 and len(test) == 100
    assert not {e for e, _ in train.pairs} & {e for e, _ in test.pairs}
    assert train.pairs == again.pairs and train.pairs != other.pairs
    for row, (english, french) in enumerate(train.pairs):
        assert train.decode_source(train.src[row]) == english.split()
        assert train.decode_target(train.tgt_out[row]) == french.split()
        length = len(french.split())
        assert train.tgt_in[row, 0] == BOS and train.tgt_out[row, length] == EOS
        assert torch.equal(train.tgt_in[row, 1:length + 1], train.tgt_out[row, :length])
        assert (train.tgt_out[row, length + 1:] == PAD).all()


def test_excluded_sentences_are_in_neither_set():
    held_out = ["the black cat ate the white mouse", "the dog sees the cow"]
    train, test = make_phrase_split(30_000, 5_278, exclude=held_out)  # every other sentence of the grammar
    seen = {e for e, _ in train.pairs} | {e for e, _ in test.pairs}
    assert len(seen) == len(all_english_sentences()) - 2 and not seen & set(held_out)
    with pytest.raises(ValueError, match="not in the grammar"):
        make_phrase_split(10, 10, exclude=["the purple cat sees the dog"])


def test_vocabularies_start_with_the_shared_specials():
    assert len(phrases.SPECIALS) == NUM_SPECIAL
    for vocab in (phrases.SOURCE_VOCAB, phrases.TARGET_VOCAB):
        assert vocab[PAD] == "<pad>" and vocab[BOS] == "<bos>" and vocab[EOS] == "<eos>"
        assert len(vocab) == len(set(vocab))
    assert "mangé" in phrases.TARGET_VOCAB and "black" in phrases.SOURCE_VOCAB


def test_bad_input_raises():
    train, _ = make_phrase_split(10, 10)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        train.encode_source(["the purple cat sees the dog"])
    with pytest.raises(ValueError, match="exactly one verb"):
        translate("the cat the dog")
    with pytest.raises(ValueError, match="noun phrase"):
        translate("the cat sees dog")
    with pytest.raises(ValueError, match="exceeds"):
        make_phrase_split(35_000, 1_000)
    with pytest.raises(ValueError, match="num_test"):
        make_phrase_split(10, 0)
