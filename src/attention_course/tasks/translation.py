"""A generated English → French-like mini-language for training a translator (chapter 10).

Every pair is produced from a seed by a small grammar; nothing is downloaded. The language is tiny
(46 English and 62 French words) but has the phenomena that make translation more than a word-for-word
lookup:

- **reordering**: colour adjectives follow the noun, "the black cat" → "le chat noir";
- **agreement**: the article and the adjective take the noun's gender, "the black mouse" → "la souris noire";
- **one word to two**: the simple past becomes a compound past, "ate" → "a mangé";
- **pronoun resolution**: in "the cow did not cross the bridge because it was too tired", "it" is the cow
  (bridges are not tired) and becomes "elle"; with "too long" it is the bridge and becomes "il". The French
  predicate adjective agrees with the same antecedent ("fatiguée", "long").

Grammar (English on the left, its French translation on the right; ``g`` is the gender of the noun)::

    S        → TRANS | CROSS
    TRANS    → NP(animal) VERB NP(object of VERB)      NP  "a" PARTICIPLE  NP
    CROSS    → NP(animal) "did not cross" NP(place)     NP  "n'a pas traversé" NP
               "because it was too" PRED                 "car" PRONOUN(g') "était trop" PRED(g')
    NP(N)    → "the" [COLOUR] N                          ART(g) N [COLOUR(g)]
    ART(m) = "le", ART(f) = "la";  PRONOUN(m) = "il", PRONOUN(f) = "elle"

where ``g'`` is the gender of the antecedent: the animal when PRED describes animals (tired, scared, slow,
lazy) and the place when PRED describes places (wide, deep, long, dangerous). Each noun phrase has a colour
with probability 1/2. "ate" takes foods as objects, "chased" and "followed" take animals, and "saw", "found" and
"liked" take any noun.

Splits. Some combinations never occur in the training set: six colour–noun pairs per split ("the green
cow") and four antecedent–predicate pairs per split ("the goat ... because it was too lazy"). They are divided
between the validation and the test set, and every validation and every test sentence is built around one
of its split's combinations (half around a colour pair, half around a pronoun case), so it contains a
combination the model has never seen, and no validation combination occurs in a test sentence. A model that
scores well on the test set has learned the rules (gender comes from the noun, position from the adjective's
class), not memorised the pairs. The three splits hold distinct source sentences.

Typical use::

    data = make_translation_data(seed=0)
    src, tgt = encode_pairs(data.train, data.src_vocab, data.tgt_vocab)   # (N, Ls), (N, Lt) token ids
    for src_batch, tgt_batch in batches(src, tgt, batch_size=64, generator=torch.Generator().manual_seed(0)):
        ...
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attention_course.checks import check_int
from attention_course.vocabulary import Vocabulary as SharedVocabulary

__all__ = [
    "ANIMALS",
    "COLOURS",
    "FOODS",
    "PLACES",
    "PREDICATES",
    "VERBS",
    "HeldOut",
    "SentencePair",
    "TranslationData",
    "Vocabulary",
    "batches",
    "encode_pairs",
    "generate_pair",
    "make_translation_data",
]

# ----------------------------------------------------------------------------------------------------------
# The lexicon. Nouns: English -> (French, gender). Adjectives: English -> (masculine, feminine).
# ----------------------------------------------------------------------------------------------------------
#: Animal nouns, English -> (French, gender). Animals are the subject of every sentence, and one of the two
#: nouns "it" can mean.
ANIMALS: dict[str, tuple[str, str]] = {
    "cat": ("chat", "m"), "dog": ("chien", "m"), "horse": ("cheval", "m"), "wolf": ("loup", "m"),
    "mouse": ("souris", "f"), "cow": ("vache", "f"), "goat": ("chèvre", "f"), "hen": ("poule", "f"),
}
#: Food nouns, English -> (French, gender). Foods are only ever objects, never a subject and never "it".
FOODS: dict[str, tuple[str, str]] = {
    "cheese": ("fromage", "m"), "bread": ("pain", "m"), "apple": ("pomme", "f"), "carrot": ("carotte", "f"),
}
#: Place nouns, English -> (French, gender). A place is what the animal "did not cross" in a pronoun
#: sentence, the other noun "it" can mean; places are also objects of the verbs that take any noun.
PLACES: dict[str, tuple[str, str]] = {
    "bridge": ("pont", "m"), "field": ("champ", "m"), "canal": ("canal", "m"),
    "street": ("rue", "f"), "river": ("rivière", "f"), "road": ("route", "f"),
}
#: Every noun of the language, :data:`ANIMALS`, :data:`FOODS` and :data:`PLACES` together.
NOUNS: dict[str, tuple[str, str]] = {**ANIMALS, **FOODS, **PLACES}

#: Colour adjectives, English -> (masculine, feminine) French forms; in French they follow the noun.
COLOURS: dict[str, tuple[str, str]] = {
    "black": ("noir", "noire"), "white": ("blanc", "blanche"), "green": ("vert", "verte"),
    "grey": ("gris", "grise"), "brown": ("brun", "brune"), "blue": ("bleu", "bleue"),
}
# Predicate adjectives of the pronoun sentences, by what they can describe.
ANIMAL_PREDICATES: dict[str, tuple[str, str]] = {
    "tired": ("fatigué", "fatiguée"), "scared": ("effrayé", "effrayée"), "slow": ("lent", "lente"),
    "lazy": ("paresseux", "paresseuse"),
}
PLACE_PREDICATES: dict[str, tuple[str, str]] = {
    "wide": ("large", "large"), "deep": ("profond", "profonde"), "long": ("long", "longue"),
    "dangerous": ("dangereux", "dangereuse"),
}
#: Predicate adjectives of the pronoun sentences ("it was too tired"), English -> (masculine, feminine);
#: the adjective decides whether "it" is the animal or the place, and so "il" or "elle".
PREDICATES: dict[str, tuple[str, str]] = {**ANIMAL_PREDICATES, **PLACE_PREDICATES}

#: The verbs, English simple past -> (French past participle, the nouns it takes as objects).
VERBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ate": ("mangé", tuple(FOODS)),
    "chased": ("chassé", tuple(ANIMALS)),
    "followed": ("suivi", tuple(ANIMALS)),
    "saw": ("vu", tuple(NOUNS)),
    "found": ("trouvé", tuple(NOUNS)),
    "liked": ("aimé", tuple(NOUNS)),
}
ARTICLES = {"m": "le", "f": "la"}
PRONOUNS = {"m": "il", "f": "elle"}

ENGLISH_FUNCTION_WORDS = ("the", "did", "not", "cross", "because", "it", "was", "too")
FRENCH_FUNCTION_WORDS = ("le", "la", "a", "n'a", "pas", "traversé", "car", "il", "elle", "était", "trop")

# How many held-out combinations of each kind go to the validation set and to the test set.
HELD_OUT_COLOUR_PAIRS = 6
HELD_OUT_PREDICATE_PAIRS = 4


def _gender_form(forms: tuple[str, str], gender: str) -> str:
    return forms[0] if gender == "m" else forms[1]


# ----------------------------------------------------------------------------------------------------------
# Sentence pairs
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SentencePair:
    """One English sentence and its translation, with the combinations it contains.

    Attributes:
        source: the English sentence, words separated by single spaces.
        target: the French translation, words separated by single spaces.
        kind: ``"transitive"`` (subject, verb, object) or ``"pronoun"`` (the "did not cross" sentences).
        colour_pairs: the ``(colour, noun)`` pairs it contains, in English, e.g. ``(("black", "cat"),)``.
        antecedent: for a pronoun sentence, the English noun "it" refers to; None otherwise.
        predicate: for a pronoun sentence, the English predicate adjective ("tired"); None otherwise.
    """

    source: str
    target: str
    kind: str
    colour_pairs: tuple[tuple[str, str], ...] = ()
    antecedent: str | None = None
    predicate: str | None = None

    @property
    def predicate_pair(self) -> tuple[str, str] | None:
        """``(antecedent, predicate)`` for a pronoun sentence, else None."""
        return None if self.antecedent is None else (self.antecedent, self.predicate)


# Sorted once: random.choice over these keeps the draws reproducible and fast.
_ANIMAL_LIST, _PLACE_LIST = tuple(sorted(ANIMALS)), tuple(sorted(PLACES))
_COLOUR_LIST, _VERB_LIST, _PREDICATE_LIST = tuple(sorted(COLOURS)), tuple(sorted(VERBS)), tuple(sorted(PREDICATES))
_RANDOM = "<random>"  # "draw this slot at random"; None means "no colour"


def _noun_phrase(rng: random.Random, noun: str, colour: str | None) -> tuple[list[str], list[str], tuple]:
    """English and French words of "the [colour] noun", and its colour pair if any.

    ``colour`` is a colour, None for no colour, or ``_RANDOM`` for no colour or a random one with probability
    1/2 each.
    """
    if colour == _RANDOM:
        colour = rng.choice(_COLOUR_LIST) if rng.random() < 0.5 else None
    french_noun, gender = NOUNS[noun]
    if colour is None:
        return ["the", noun], [ARTICLES[gender], french_noun], ()
    french_colour = _gender_form(COLOURS[colour], gender)  # agreement, and the adjective moves after the noun
    return ["the", colour, noun], [ARTICLES[gender], french_noun, french_colour], ((colour, noun),)


def _transitive(rng: random.Random, subject: str, subject_colour, verb: str, obj: str, object_colour) -> SentencePair:
    subject_en, subject_fr, subject_pairs = _noun_phrase(rng, subject, subject_colour)
    object_en, object_fr, object_pairs = _noun_phrase(rng, obj, object_colour)
    source = [*subject_en, verb, *object_en]
    target = [*subject_fr, "a", VERBS[verb][0], *object_fr]  # "ate" -> "a mangé": one word becomes two
    return SentencePair(" ".join(source), " ".join(target), "transitive", subject_pairs + object_pairs)


def _pronoun(
    rng: random.Random, subject: str, subject_colour, place: str, place_colour, predicate: str
) -> SentencePair:
    subject_en, subject_fr, subject_pairs = _noun_phrase(rng, subject, subject_colour)
    place_en, place_fr, place_pairs = _noun_phrase(rng, place, place_colour)
    # "it" is whichever noun the predicate can describe: animals get tired, places are wide.
    antecedent = subject if predicate in ANIMAL_PREDICATES else place
    gender = NOUNS[antecedent][1]
    source = [*subject_en, "did", "not", "cross", *place_en, "because", "it", "was", "too", predicate]
    target = [*subject_fr, "n'a", "pas", "traversé", *place_fr, "car", PRONOUNS[gender], "était", "trop",
              _gender_form(PREDICATES[predicate], gender)]
    return SentencePair(" ".join(source), " ".join(target), "pronoun", subject_pairs + place_pairs, antecedent,
                        predicate)


def generate_pair(
    rng: random.Random,
    kind: str | None = None,
    colour_pair: tuple[str, str] | None = None,
    predicate_pair: tuple[str, str] | None = None,
) -> SentencePair:
    """Draw one sentence pair from the grammar (see the module docstring).

    Args:
        rng: the random source (a ``random.Random``), so that callers control determinism.
        kind: ``"transitive"``, ``"pronoun"``, or None for either with probability 1/2.
        colour_pair: ``(colour, noun)`` that the sentence must contain (e.g. ``("green", "cow")``).
        predicate_pair: ``(antecedent, predicate)`` that a pronoun sentence must contain (e.g.
            ``("cow", "tired")``); implies ``kind="pronoun"``. At most one of the two may be given.
    """
    if not isinstance(rng, random.Random):
        raise TypeError(f"rng must be a random.Random, got {type(rng).__name__}")
    if kind not in (None, "transitive", "pronoun"):
        raise ValueError(f"kind must be 'transitive', 'pronoun' or None, got {kind!r}")
    if colour_pair is not None and predicate_pair is not None:
        raise ValueError("give at most one of colour_pair and predicate_pair")
    if predicate_pair is not None:
        return _forced_predicate(rng, predicate_pair, kind)
    if colour_pair is not None:
        return _forced_colour(rng, colour_pair, kind)
    if kind is None:
        kind = "transitive" if rng.random() < 0.5 else "pronoun"
    subject = rng.choice(_ANIMAL_LIST)
    if kind == "transitive":
        verb = rng.choice(_VERB_LIST)
        return _transitive(rng, subject, _RANDOM, verb, rng.choice(VERBS[verb][1]), _RANDOM)
    return _pronoun(rng, subject, _RANDOM, rng.choice(_PLACE_LIST), _RANDOM, rng.choice(_PREDICATE_LIST))


def _forced_predicate(rng: random.Random, predicate_pair: tuple[str, str], kind: str | None) -> SentencePair:
    antecedent, predicate = predicate_pair
    if kind == "transitive":
        raise ValueError("a predicate_pair needs a pronoun sentence, got kind='transitive'")
    if predicate in ANIMAL_PREDICATES and antecedent in ANIMALS:
        return _pronoun(rng, antecedent, _RANDOM, rng.choice(_PLACE_LIST), _RANDOM, predicate)
    if predicate in PLACE_PREDICATES and antecedent in PLACES:
        return _pronoun(rng, rng.choice(_ANIMAL_LIST), _RANDOM, antecedent, _RANDOM, predicate)
    raise ValueError(f"{predicate!r} cannot describe {antecedent!r}: animal predicates {sorted(ANIMAL_PREDICATES)} "
                     f"go with animals, place predicates {sorted(PLACE_PREDICATES)} with places")


def _forced_colour(rng: random.Random, colour_pair: tuple[str, str], kind: str | None) -> SentencePair:
    colour, noun = colour_pair
    if colour not in COLOURS or noun not in NOUNS:
        raise ValueError(f"colour_pair must be (colour, noun) from the lexicon, got {colour_pair!r}")
    # Every slot where the noun can stand: subject (animals), object of a verb, crossed place (places).
    slots = []
    if noun in ANIMALS:
        slots += [("transitive", "subject"), ("pronoun", "subject")]
    slots += [("transitive", verb) for verb in _VERB_LIST if noun in VERBS[verb][1]]
    if noun in PLACES:
        slots.append(("pronoun", "place"))
    slots = [slot for slot in slots if kind is None or slot[0] == kind]
    if not slots:
        raise ValueError(f"{noun!r} cannot appear in a {kind} sentence")
    slot_kind, slot = rng.choice(slots)
    if slot_kind == "pronoun":
        subject = noun if slot == "subject" else rng.choice(_ANIMAL_LIST)
        place = noun if slot == "place" else rng.choice(_PLACE_LIST)
        return _pronoun(rng, subject, colour if slot == "subject" else _RANDOM, place,
                        colour if slot == "place" else _RANDOM, rng.choice(_PREDICATE_LIST))
    if slot == "subject":
        verb = rng.choice(_VERB_LIST)
        return _transitive(rng, noun, colour, verb, rng.choice(VERBS[verb][1]), _RANDOM)
    return _transitive(rng, rng.choice(_ANIMAL_LIST), _RANDOM, slot, noun, colour)


# ----------------------------------------------------------------------------------------------------------
# Held-out combinations and the three splits
# ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldOut:
    """Combinations kept out of training: ``valid_*`` appear only in validation, ``test_*`` only in test.

    ``*_colours`` are ``(colour, noun)`` pairs; ``*_predicates`` are ``(antecedent, predicate)`` pairs.
    """

    valid_colours: frozenset[tuple[str, str]]
    test_colours: frozenset[tuple[str, str]]
    valid_predicates: frozenset[tuple[str, str]]
    test_predicates: frozenset[tuple[str, str]]

    def split_of(self, pair: SentencePair) -> str:
        """Where ``pair`` may go: ``"train"`` (no held-out combination), ``"valid"``, ``"test"``, or ``"none"``
        (it mixes validation and test combinations, so it is used nowhere)."""
        colours = set(pair.colour_pairs)
        predicate = {pair.predicate_pair} if pair.predicate_pair else set()
        in_valid = bool(colours & self.valid_colours or predicate & self.valid_predicates)
        in_test = bool(colours & self.test_colours or predicate & self.test_predicates)
        if in_valid and in_test:
            return "none"
        return "valid" if in_valid else "test" if in_test else "train"


def _choose_held_out(rng: random.Random) -> HeldOut:
    """Pick the held-out combinations: within a split no word repeats, no noun is held out twice, and the
    held-out nouns alternate between the genders, so both agreement forms are tested."""

    def pick(pairs: list[tuple[str, str]], per_split: int, noun_of) -> tuple[frozenset, frozenset]:
        rng.shuffle(pairs)
        chosen: dict[str, list[tuple[str, str]]] = {"valid": [], "test": []}
        nouns_used: set[str] = set()
        for index in range(2 * per_split):
            split, gender = ("valid", "test")[index % 2], ("m", "f")[(index // 2) % 2]
            words_used = {word for pair in chosen[split] for word in pair}
            for pair in pairs:
                noun = noun_of(pair)
                if NOUNS[noun][1] == gender and noun not in nouns_used and not set(pair) & words_used:
                    chosen[split].append(pair)
                    nouns_used.add(noun)
                    break
            else:  # cannot happen with the lexicon above; guards against editing it carelessly
                raise ValueError(f"cannot choose {per_split} held-out pairs per split from {len(pairs)} pairs")
        return frozenset(chosen["valid"]), frozenset(chosen["test"])

    colour_pairs = [(colour, noun) for colour in sorted(COLOURS) for noun in sorted(NOUNS)]
    valid_colours, test_colours = pick(colour_pairs, HELD_OUT_COLOUR_PAIRS, lambda pair: pair[1])
    predicate_pairs = [(animal, pred) for animal in sorted(ANIMALS) for pred in sorted(ANIMAL_PREDICATES)]
    predicate_pairs += [(place, pred) for place in sorted(PLACES) for pred in sorted(PLACE_PREDICATES)]
    valid_predicates, test_predicates = pick(predicate_pairs, HELD_OUT_PREDICATE_PAIRS, lambda pair: pair[0])
    return HeldOut(valid_colours, test_colours, valid_predicates, test_predicates)


# ----------------------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------------------
#: The vocabulary type of this task: the course's shared :class:`attention_course.vocabulary.Vocabulary`
#: (``<pad>``, ``<bos>``, ``<eos>`` first; words without spaces; unknown words raise ``KeyError``).
Vocabulary = SharedVocabulary


def english_vocabulary() -> Vocabulary:
    """Every English word the grammar can produce (46 words, plus the 3 special tokens)."""
    return Vocabulary([*ENGLISH_FUNCTION_WORDS, *NOUNS, *COLOURS, *VERBS, *PREDICATES])


def french_vocabulary() -> Vocabulary:
    """Every French word the grammar can produce (62 words, plus the 3 special tokens)."""
    words = [*FRENCH_FUNCTION_WORDS, *(french for french, _ in NOUNS.values())]
    words += [form for forms in COLOURS.values() for form in forms]
    words += [participle for participle, _ in VERBS.values()]
    words += [form for forms in PREDICATES.values() for form in forms]
    return Vocabulary(words)


# ----------------------------------------------------------------------------------------------------------
# The data set
# ----------------------------------------------------------------------------------------------------------
@dataclass
class TranslationData:
    """The three splits, the two vocabularies and the held-out combinations."""

    train: list[SentencePair]
    valid: list[SentencePair]
    test: list[SentencePair]
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary
    held_out: HeldOut
    seed: int = field(default=0)

    def __repr__(self) -> str:
        return (f"TranslationData(train={len(self.train)}, valid={len(self.valid)}, test={len(self.test)}, "
                f"src_vocab={len(self.src_vocab)}, tgt_vocab={len(self.tgt_vocab)}, seed={self.seed})")


def make_translation_data(
    seed: int = 0, num_train: int = 8000, num_valid: int = 500, num_test: int = 1000
) -> TranslationData:
    """Generate the train, validation and test splits (distinct sentences), deterministically from ``seed``.

    Args:
        seed: seeds the choice of held-out combinations and every sentence.
        num_train, num_valid, num_test: sizes of the splits. Training sentences contain no held-out
            combination; each validation (test) sentence contains at least one validation (test) combination.

    Raises:
        TypeError: a size or the seed is not an int.
        ValueError: a size is less than 1, or more distinct sentences are asked for than the grammar can make
            in a reasonable number of draws.
    """
    for name, value in (("num_train", num_train), ("num_valid", num_valid), ("num_test", num_test)):
        check_int(name, value)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    rng = random.Random(seed)
    held_out = _choose_held_out(rng)
    wanted = {"train": num_train, "valid": num_valid, "test": num_test}
    # Validation and test sentences are built around one of their split's combinations, half of them a
    # colour pair and half a pronoun case; the rest of the sentence is random (and must not bring in a
    # combination of another split).
    combinations = {
        "valid": (sorted(held_out.valid_colours), sorted(held_out.valid_predicates)),
        "test": (sorted(held_out.test_colours), sorted(held_out.test_predicates)),
    }
    splits: dict[str, list[SentencePair]] = {"train": [], "valid": [], "test": []}
    seen: set[str] = set()
    for split in ("test", "valid", "train"):
        misses = 0  # consecutive draws that gave nothing new: the split's sentences are running out
        draw = 0
        while len(splits[split]) < wanted[split]:
            draw += 1
            if split == "train":
                pair = generate_pair(rng)
            elif draw % 2 == 0:
                pair = generate_pair(rng, colour_pair=rng.choice(combinations[split][0]))
            else:
                pair = generate_pair(rng, predicate_pair=rng.choice(combinations[split][1]))
            if held_out.split_of(pair) == split and pair.source not in seen:
                seen.add(pair.source)
                splits[split].append(pair)
                misses = 0
            elif misses == 2000:
                raise ValueError(f"could not draw {wanted[split]} distinct {split} sentences (got "
                                 f"{len(splits[split])} before 2000 draws in a row gave nothing new); ask for fewer")
            else:
                misses += 1
    return TranslationData(splits["train"], splits["valid"], splits["test"], english_vocabulary(),
                           french_vocabulary(), held_out, seed)


# ----------------------------------------------------------------------------------------------------------
# Tensors and batches
# ----------------------------------------------------------------------------------------------------------
def _pad(sequences: list[list[int]], pad_id: int) -> Tensor:
    length = max(len(sequence) for sequence in sequences)
    return torch.tensor([sequence + [pad_id] * (length - len(sequence)) for sequence in sequences], dtype=torch.long)


def encode_pairs(
    pairs: Sequence[SentencePair], src_vocab: Vocabulary, tgt_vocab: Vocabulary
) -> tuple[Tensor, Tensor]:
    """Token ids of a list of pairs, padded to the longest sentence.

    Returns:
        ``(src, tgt)``: ``src (N, Ls)`` with each English sentence followed by eos (the encoder needs no bos),
        and ``tgt (N, Lt)`` with each French sentence framed by bos and eos. Both are padded with ``pad_id``.
    """
    if len(pairs) == 0:
        raise ValueError("encode_pairs needs at least one pair")
    src = _pad([src_vocab.encode(pair.source, add_bos=False) for pair in pairs], src_vocab.pad_id)
    tgt = _pad([tgt_vocab.encode(pair.target) for pair in pairs], tgt_vocab.pad_id)
    return src, tgt


def batches(
    src: Tensor, tgt: Tensor, batch_size: int, generator: torch.Generator | None = None, shuffle: bool = True
) -> Iterator[tuple[Tensor, Tensor]]:
    """One pass over ``(src (N, Ls), tgt (N, Lt))`` in batches of ``batch_size`` rows (the last may be smaller).

    Each batch is trimmed to its own longest sentence, so short batches carry little padding. With
    ``shuffle`` the order is a permutation drawn from ``generator``.

    Yields:
        ``(src_batch (B, Ls'), tgt_batch (B, Lt'))``.
    """
    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
        raise ValueError(f"src and tgt must be (N, L) tensors with the same N, got {tuple(src.shape)} and "
                         f"{tuple(tgt.shape)}")
    check_int("batch_size", batch_size)
    order = torch.randperm(src.size(0), generator=generator) if shuffle else torch.arange(src.size(0))
    for start in range(0, src.size(0), batch_size):
        index = order[start : start + batch_size]
        yield _trim(src[index]), _trim(tgt[index])


def _trim(tokens: Tensor, pad_id: int = 0) -> Tensor:
    """Drop the columns that are padding in every row."""
    used = (tokens != pad_id).any(dim=0).nonzero()
    return tokens[:, : int(used.max()) + 1] if used.numel() else tokens
