"""A tiny English→French phrase set where word order changes: "the black cat" → "le chat noir".

The grammar has one sentence form, ``the [ADJ] NOUN VERB the [ADJ] NOUN``, with an optional colour adjective
in each noun phrase. Its French translation needs the three things that make word-by-word translation fail:

- **inversion**: French colour adjectives follow the noun ("black cat" → "chat noir");
- **agreement**: the article and the adjective take the noun's gender ("the black mouse" → "la souris noire");
- **one word to two**: "ate" becomes "a mangé" (a passé composé), so the output can be longer than the input.

Token ids, shared with :mod:`attention_course.tasks.sequences`: 0 = PAD, 1 = BOS, 2 = EOS, then the words
of each language in alphabetical order (the vocabularies come from the grammar, not from the sample).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import Tensor

from attention_course.checks import check_int
from attention_course.tasks.sequences import BOS, EOS, PAD
from attention_course.vocabulary import Vocabulary

__all__ = [
    "ADJECTIVES",
    "NOUNS",
    "VERBS",
    "PhraseTask",
    "all_english_sentences",
    "make_phrase_split",
    "translate",
]

SPECIALS = ("<pad>", "<bos>", "<eos>")

#: English noun → (French noun, gender). No noun starts with a vowel, so the article is always "le" or "la".
NOUNS: dict[str, tuple[str, str]] = {
    "cat": ("chat", "m"),
    "dog": ("chien", "m"),
    "mouse": ("souris", "f"),
    "horse": ("cheval", "m"),
    "cow": ("vache", "f"),
    "rabbit": ("lapin", "m"),
    "duck": ("canard", "m"),
    "frog": ("grenouille", "f"),
    "goat": ("chèvre", "f"),
    "fox": ("renard", "m"),
    "hen": ("poule", "f"),
    "sheep": ("mouton", "m"),
}
#: English colour adjective → (masculine, feminine) French forms; all of them follow the noun in French.
ADJECTIVES: dict[str, tuple[str, str]] = {
    "black": ("noir", "noire"),
    "white": ("blanc", "blanche"),
    "green": ("vert", "verte"),
    "grey": ("gris", "grise"),
    "red": ("rouge", "rouge"),
    "blue": ("bleu", "bleue"),
}
#: English verb → its French words (one or two).
VERBS: dict[str, tuple[str, ...]] = {
    "ate": ("a", "mangé"),
    "sees": ("voit",),
    "chases": ("chasse",),
    "likes": ("aime",),
    "follows": ("suit",),
}
ARTICLES = {"m": "le", "f": "la"}


def _noun_phrases() -> list[tuple[str, ...]]:
    """Every English noun phrase: ``the NOUN`` and ``the ADJ NOUN``."""
    phrases = []
    for noun in NOUNS:
        phrases.append(("the", noun))
        phrases.extend(("the", adjective, noun) for adjective in ADJECTIVES)
    return phrases


def all_english_sentences() -> list[str]:
    """Every sentence of the grammar, in a fixed order (12 nouns × 7 adjective choices, squared, × 5 verbs)."""
    phrases = _noun_phrases()
    return [" ".join((*subject, verb, *obj)) for subject, verb, obj in itertools.product(phrases, VERBS, phrases)]


def _translate_noun_phrase(words: list[str]) -> list[str]:
    if len(words) not in (2, 3) or words[0] != "the" or words[-1] not in NOUNS:
        raise ValueError(f"expected a noun phrase 'the [ADJ] NOUN', got {' '.join(words)!r}")
    french_noun, gender = NOUNS[words[-1]]
    translated = [ARTICLES[gender], french_noun]
    if len(words) == 3:
        if words[1] not in ADJECTIVES:
            raise ValueError(f"unknown adjective {words[1]!r}; the adjectives are {sorted(ADJECTIVES)}")
        masculine, feminine = ADJECTIVES[words[1]]
        translated.append(masculine if gender == "m" else feminine)  # after the noun, agreeing with it
    return translated


def translate(english: str) -> str:
    """The reference French translation of a sentence of the grammar.

    Example:
        >>> translate("the black cat ate the white mouse")
        'le chat noir a mangé la souris blanche'
    """
    words = english.split()
    verb_positions = [i for i, word in enumerate(words) if word in VERBS]
    if len(verb_positions) != 1:
        raise ValueError(f"expected exactly one verb from {sorted(VERBS)} in {english!r}")
    v = verb_positions[0]
    french = _translate_noun_phrase(words[:v]) + list(VERBS[words[v]]) + _translate_noun_phrase(words[v + 1:])
    return " ".join(french)


def _vocabulary(words: set[str]) -> Vocabulary:
    return Vocabulary(sorted(words), specials=SPECIALS)


#: The English vocabulary: a :class:`~attention_course.vocabulary.Vocabulary` (indexable like a list of words).
SOURCE_VOCAB: Vocabulary = _vocabulary({"the", *NOUNS, *ADJECTIVES, *VERBS})
#: The French vocabulary, ids as :data:`SOURCE_VOCAB`.
TARGET_VOCAB: Vocabulary = _vocabulary(
    {*ARTICLES.values(), *(noun for noun, _ in NOUNS.values()), *itertools.chain(*ADJECTIVES.values()),
     *itertools.chain(*VERBS.values())}
)


@dataclass
class PhraseTask:
    """Sentence pairs as right-padded token tensors.

    Attributes:
        pairs: the ``(english, french)`` sentences, one per row.
        src: ``(N, S)`` English ids.
        tgt_in: ``(N, T)`` BOS + French ids.
        tgt_out: ``(N, T)`` French ids + EOS.
        source_vocab: the English :class:`~attention_course.vocabulary.Vocabulary` (``vocab[id]`` is a word).
        target_vocab: the French vocabulary.
    """

    pairs: list[tuple[str, str]]
    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    source_vocab: Vocabulary
    target_vocab: Vocabulary

    def __len__(self) -> int:
        return len(self.pairs)

    def encode_source(self, sentences: list[str]) -> Tensor:
        """English sentences → right-padded ids ``(len(sentences), longest)``."""
        return _encode([s.split() for s in sentences], self.source_vocab)

    def decode_target(self, ids: Tensor | list[int]) -> list[str]:
        """One row of French ids → words, stopping at EOS or PAD."""
        return _decode(ids, self.target_vocab)

    def decode_source(self, ids: Tensor | list[int]) -> list[str]:
        """One row of English ids → words, stopping at EOS or PAD."""
        return _decode(ids, self.source_vocab)


def _encode(sentences: list[list[str]], vocab: Vocabulary) -> Tensor:
    index = {word: i for i, word in enumerate(vocab)}
    unknown = sorted({word for words in sentences for word in words if word not in index})
    if unknown:
        raise ValueError(f"words not in the vocabulary: {unknown}")
    longest = max(len(words) for words in sentences)
    rows = [[index[word] for word in words] + [PAD] * (longest - len(words)) for words in sentences]
    return torch.tensor(rows, dtype=torch.long)  # (N, longest), right-padded


def _decode(ids: Tensor | list[int], vocab: Vocabulary) -> list[str]:
    words = []
    for token in ids.tolist() if isinstance(ids, Tensor) else ids:
        if token in (EOS, PAD):
            break
        if token != BOS:
            words.append(vocab[token])
    return words


def _make_task(english: list[str]) -> PhraseTask:
    pairs = [(sentence, translate(sentence)) for sentence in english]
    src = _encode([e.split() for e, _ in pairs], SOURCE_VOCAB)  # (N, S)
    french = [f.split() for _, f in pairs]
    words = _encode(french, TARGET_VOCAB)  # (N, T - 1)
    lengths = torch.tensor([len(f) for f in french])
    n = len(pairs)
    tgt_in = torch.cat([torch.full((n, 1), BOS, dtype=torch.long), words], dim=1)  # (N, T)
    tgt_out = torch.cat([words, torch.full((n, 1), PAD, dtype=torch.long)], dim=1)
    tgt_out[torch.arange(n), lengths] = EOS
    return PhraseTask(pairs, src, tgt_in, tgt_out, SOURCE_VOCAB, TARGET_VOCAB)


def make_phrase_split(
    num_train: int, num_test: int, seed: int = 0, exclude: Collection[str] = ()
) -> tuple[PhraseTask, PhraseTask]:
    """Draw distinct sentences of the grammar: ``num_train`` for training and ``num_test`` unseen ones for testing.

    Args:
        num_train, num_test: how many pairs in each set; together at most the grammar's 35,280 sentences.
        seed: the split is a deterministic function of the sizes, this seed and ``exclude``.
        exclude: sentences to keep out of both sets, for example the ones a lesson uses as unseen examples.

    Returns:
        ``(train, test)``, two :class:`PhraseTask` with no English sentence in common.
    """
    for name, value in (("num_train", num_train), ("num_test", num_test)):
        check_int(name, value)
    excluded = set(exclude)
    sentences = all_english_sentences()
    unknown = sorted(excluded - set(sentences))
    if unknown:
        raise ValueError(f"sentences to exclude that are not in the grammar: {unknown}")
    sentences = [sentence for sentence in sentences if sentence not in excluded]
    if num_train + num_test > len(sentences):
        raise ValueError(
            f"num_train + num_test = {num_train + num_test} exceeds the {len(sentences)} sentences available"
        )
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed)).tolist()
    train = [sentences[i] for i in order[:num_train]]
    test = [sentences[i] for i in order[num_train:num_train + num_test]]
    return _make_task(train), _make_task(test)
