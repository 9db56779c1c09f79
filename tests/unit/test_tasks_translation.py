"""The generated English → French mini-language: determinism, splits, held-out combinations, grammar rules.

The grammar checks parse the generated sentences independently of the generator: they look words up in the
lexicon and check each rule (articles and adjectives agree with their noun, colours move after the noun,
the past becomes "a" + participle, "it" becomes the pronoun of the noun the predicate can describe).
"""

import random

import pytest
import torch

from attention_course.tasks import translation as tr
from attention_course.tasks.translation import (
    ANIMALS,
    COLOURS,
    PLACES,
    PREDICATES,
    VERBS,
    Vocabulary,
    batches,
    encode_pairs,
    generate_pair,
    make_translation_data,
)

FRENCH_NOUNS = {french: gender for french, gender in tr.NOUNS.values()}
FRENCH_COLOURS = {form: (english, index) for english, forms in COLOURS.items() for index, form in enumerate(forms)}
GENDER_INDEX = {"m": 0, "f": 1}


@pytest.fixture(scope="module")
def data():
    return make_translation_data(seed=1, num_train=3000, num_valid=300, num_test=400)


def all_pairs(data):
    return data.train + data.valid + data.test


def test_same_seed_same_data_and_other_seed_other_data():
    first = make_translation_data(seed=5, num_train=300, num_valid=50, num_test=50)
    again = make_translation_data(seed=5, num_train=300, num_valid=50, num_test=50)
    other = make_translation_data(seed=6, num_train=300, num_valid=50, num_test=50)
    assert first.train == again.train and first.valid == again.valid and first.test == again.test
    assert first.held_out == again.held_out
    assert first.train != other.train


def test_split_sizes_and_disjoint_sources(data):
    assert (len(data.train), len(data.valid), len(data.test)) == (3000, 300, 400)
    train, valid, test = ({pair.source for pair in split} for split in (data.train, data.valid, data.test))
    assert len(train) == 3000 and len(valid) == 300 and len(test) == 400  # no duplicates inside a split
    assert not train & valid and not train & test and not valid & test


def test_held_out_combinations_never_in_training(data):
    held = data.held_out
    all_colours = held.valid_colours | held.test_colours
    all_predicates = held.valid_predicates | held.test_predicates
    assert len(held.valid_colours) == len(held.test_colours) == tr.HELD_OUT_COLOUR_PAIRS
    assert len(held.valid_predicates) == len(held.test_predicates) == tr.HELD_OUT_PREDICATE_PAIRS
    assert not held.valid_colours & held.test_colours and not held.valid_predicates & held.test_predicates
    for pair in data.train:
        assert not set(pair.colour_pairs) & all_colours, pair
        assert pair.predicate_pair not in all_predicates, pair
        # The English text agrees with the recorded combinations (so the check above is about the text).
        for colour, noun in pair.colour_pairs:
            assert f"{colour} {noun}" in pair.source


@pytest.mark.parametrize("split, other", [("valid", "test"), ("test", "valid")])
def test_each_evaluation_sentence_has_a_combination_of_its_split_only(data, split, other):
    held = data.held_out
    mine = (getattr(held, f"{split}_colours"), getattr(held, f"{split}_predicates"))
    theirs = (getattr(held, f"{other}_colours"), getattr(held, f"{other}_predicates"))
    kinds = set()
    for pair in getattr(data, split):
        colours = set(pair.colour_pairs)
        assert colours & mine[0] or pair.predicate_pair in mine[1], pair
        assert not colours & theirs[0] and pair.predicate_pair not in theirs[1], pair
        kinds.add(pair.kind)
    assert kinds == {"transitive", "pronoun"}


def test_held_out_words_are_still_learnable_from_training(data):
    """Every held-out noun and adjective occurs in training, the adjective with a noun of the same gender."""
    seen_colours = {pair for sentence in data.train for pair in sentence.colour_pairs}
    seen_predicates = {sentence.predicate_pair for sentence in data.train if sentence.predicate_pair}
    held = data.held_out
    for colour, noun in held.valid_colours | held.test_colours:
        gender = tr.NOUNS[noun][1]
        assert any(n == noun for _, n in seen_colours)
        assert any(c == colour and tr.NOUNS[n][1] == gender for c, n in seen_colours)
    for antecedent, predicate in held.valid_predicates | held.test_predicates:
        gender = tr.NOUNS[antecedent][1]
        assert any(a == antecedent for a, _ in seen_predicates)
        assert any(p == predicate and tr.NOUNS[a][1] == gender for a, p in seen_predicates)


def check_noun_phrases(english: list[str], french: list[str]) -> None:
    """Articles and colours agree with their noun; the colour follows the noun in French, precedes it in English."""
    english_nps = []
    for index, word in enumerate(english):
        if word in tr.NOUNS:
            colour = english[index - 1] if english[index - 1] in COLOURS else None
            english_nps.append((word, colour))
    french_nps = []
    for index, word in enumerate(french):
        if word in FRENCH_NOUNS:
            gender = FRENCH_NOUNS[word]
            assert french[index - 1] == {"m": "le", "f": "la"}[gender], (english, french)
            following = french[index + 1] if index + 1 < len(french) else None
            colour = None
            if following in FRENCH_COLOURS:
                colour, form = FRENCH_COLOURS[following]
                # "blanc"/"blanche": the form must be the noun's gender (no colour has equal forms).
                assert form == GENDER_INDEX[gender], (english, french)
            french_nps.append((word, colour))
    assert [(tr.NOUNS[noun][0], colour) for noun, colour in english_nps] == french_nps, (english, french)


def test_agreement_and_word_order_hold_in_every_pair(data):
    for pair in all_pairs(data):
        check_noun_phrases(pair.source.split(), pair.target.split())


def test_past_tense_becomes_a_plus_participle(data):
    for pair in all_pairs(data):
        english, french = pair.source.split(), pair.target.split()
        if pair.kind != "transitive":
            continue
        verbs = [word for word in english if word in VERBS]
        assert len(verbs) == 1
        assert french.count("a") == 1, pair
        position = french.index("a")
        assert french[position + 1] == VERBS[verbs[0]][0], pair
        # Everything before the verb is the subject's noun phrase, in both languages.
        check_noun_phrases(english[: english.index(verbs[0])], french[:position])


def test_pronoun_refers_to_the_noun_the_predicate_describes(data):
    """"it" → il/elle by the gender of the antecedent: the animal if it can be tired, else the place."""
    counts = {"subject": 0, "place": 0, "genders differ": 0}
    for pair in all_pairs(data):
        if pair.kind != "pronoun":
            continue
        english, french = pair.source.split(), pair.target.split()
        subject = english[english.index("did") - 1]
        place = english[english.index("because") - 1]
        predicate = english[-1]
        assert subject in ANIMALS and place in PLACES and predicate in PREDICATES
        antecedent = subject if predicate in tr.ANIMAL_PREDICATES else place
        gender = tr.NOUNS[antecedent][1]
        assert french[french.index("car") + 1] == {"m": "il", "f": "elle"}[gender], pair
        assert french[-1] == PREDICATES[predicate][GENDER_INDEX[gender]], pair
        assert french[french.index("car") + 2 : -1] == ["était", "trop"]
        assert pair.antecedent == antecedent and pair.predicate == predicate
        counts["subject" if antecedent == subject else "place"] += 1
        counts["genders differ"] += tr.NOUNS[subject][1] != tr.NOUNS[place][1]
    # Both readings occur often, and so do sentences where the two nouns' genders differ (the hard cases).
    assert min(counts.values()) > 100, counts


def test_forced_combinations_appear_and_bad_ones_raise():
    rng = random.Random(0)
    for _ in range(50):
        assert ("green", "cow") in generate_pair(rng, colour_pair=("green", "cow")).colour_pairs
        assert ("blue", "river") in generate_pair(rng, colour_pair=("blue", "river")).colour_pairs
        pair = generate_pair(rng, predicate_pair=("road", "wide"))
        assert pair.predicate_pair == ("road", "wide")
        assert generate_pair(rng, kind="transitive").kind == "transitive"
    with pytest.raises(ValueError, match="cannot describe"):
        generate_pair(rng, predicate_pair=("cow", "wide"))
    with pytest.raises(ValueError, match="kind"):
        generate_pair(rng, kind="passive")
    with pytest.raises(ValueError, match="colour_pair"):
        generate_pair(rng, colour_pair=("purple", "cow"))
    with pytest.raises(ValueError, match="cannot appear"):
        generate_pair(rng, kind="pronoun", colour_pair=("green", "apple"))
    with pytest.raises(TypeError, match="random.Random"):
        generate_pair(0)


def test_vocabulary_sizes_and_every_word_encodable(data):
    total_words = len(data.src_vocab) + len(data.tgt_vocab) - 6  # minus the special tokens
    assert 60 <= total_words <= 150
    for pair in all_pairs(data):
        data.src_vocab.encode(pair.source)
        data.tgt_vocab.encode(pair.target)


def test_vocabulary_round_trip_and_special_ids():
    vocab = Vocabulary(["le", "chat", "noir", "chat"])
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2) and len(vocab) == 6
    ids = vocab.encode("le chat noir")
    assert ids == [1, 3, 4, 5, 2]
    assert vocab.decode(ids) == "le chat noir"
    assert vocab.decode([1, 3, 2, 4, 0]) == "le"  # stops at eos
    assert vocab.decode(torch.tensor([1, 3, 0, 4])) == "le chat"  # padding and bos dropped
    assert vocab.decode([1, 3, 2], strip_special=False) == "<bos> le <eos>"
    assert vocab.encode(["chat"], add_bos=False, add_eos=False) == [4]
    with pytest.raises(KeyError, match="chien"):
        vocab.encode("le chien")
    with pytest.raises(ValueError, match="outside"):
        vocab.decode([9])
    with pytest.raises(ValueError, match="special"):
        Vocabulary(["<eos>"])
    with pytest.raises(ValueError, match="spaces"):
        Vocabulary(["le chat"])


def test_encode_pairs_and_batches(data):
    pairs = data.train[:50]
    src, tgt = encode_pairs(pairs, data.src_vocab, data.tgt_vocab)
    assert src.shape[0] == tgt.shape[0] == 50
    assert (tgt[:, 0] == data.tgt_vocab.bos_id).all()
    assert (src[:, 0] != data.src_vocab.bos_id).all()  # the encoder input has no bos
    for row, pair in enumerate(pairs):
        assert data.src_vocab.decode(src[row]) == pair.source
        assert data.tgt_vocab.decode(tgt[row]) == pair.target
        assert int((src[row] == data.src_vocab.eos_id).sum()) == 1
    seen = []
    for src_batch, tgt_batch in batches(src, tgt, 16, generator=torch.Generator().manual_seed(0)):
        assert src_batch.size(0) == tgt_batch.size(0) <= 16
        assert (src_batch != 0).any(dim=0).all() and (tgt_batch != 0).any(dim=0).all()  # trimmed
        seen += [data.tgt_vocab.decode(row) for row in tgt_batch]
    assert sorted(seen) == sorted(pair.target for pair in pairs)  # every pair exactly once
    ordered = [data.tgt_vocab.decode(row) for _, t in batches(src, tgt, 16, shuffle=False) for row in t]
    assert ordered == [pair.target for pair in pairs]
    with pytest.raises(ValueError, match="batch_size"):
        next(batches(src, tgt, 0))
    with pytest.raises(ValueError, match="same N"):
        next(batches(src, tgt[:3], 4))


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="num_train"):
        make_translation_data(num_train=0)
    with pytest.raises(ValueError, match="distinct"):
        make_translation_data(num_test=10**6)
