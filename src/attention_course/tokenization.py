"""Text → token ids for a language model: characters, and byte-pair encoding (BPE) (chapter 13).

- :class:`CharTokenizer`: one token per character, over a :class:`~attention_course.vocabulary.Vocabulary`
  built from the training text (characters it never saw become ``<unk>``).
- :class:`BPETokenizer`: byte-pair encoding (Sennrich et al. 2016) trained with the ``tokenizers`` library, in
  GPT-2's byte-level scheme (Radford et al. 2019): text is split into words and runs of spaces, each word
  starts from its UTF-8 bytes, and the vocabulary always holds all 256 byte symbols, so any text, in any
  script, encodes and decodes exactly, whatever the training text contained. BPE training is the library's
  fast, well-tested implementation; the rule it applies is simple enough to do by hand, which
  :func:`count_pairs` and :func:`merge_pair` do for the lesson.

The merge rule: start with every word spelt as a sequence of symbols; count how often each pair of adjacent
symbols occurs (each word weighted by its frequency); merge the most frequent pair into one new symbol
everywhere; repeat until the vocabulary has the wanted size. Frequent words end up as one token, rare ones
as a few pieces, and nothing is ever out of vocabulary.

Both tokenizers share one interface: ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``len(...)`` is the
vocabulary size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from torch import Tensor

from attention_course.checks import check_int
from attention_course.vocabulary import UNK, Vocabulary

__all__ = ["BYTE_ALPHABET_SIZE", "BPETokenizer", "CharTokenizer", "count_pairs", "merge_pair"]

#: The number of symbols a byte-level BPE vocabulary holds before its first merge, one per byte value.
BYTE_ALPHABET_SIZE = 256


class CharTokenizer:
    """One token per character.

    Args:
        text: the training text; its distinct characters, sorted, are the vocabulary (after ``<unk>``).

    Attributes:
        vocab: the :class:`~attention_course.vocabulary.Vocabulary` (``<unk>`` is id 0).
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError("CharTokenizer needs a non-empty training text")
        self.vocab = Vocabulary(sorted(set(text)), specials=(UNK,), allow_spaces=True)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        """``text`` -> one id per character (unseen characters -> ``<unk>``)."""
        return self.vocab.ids(text)

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """ids -> text (``<unk>`` is written as ``\\ufffd``, the replacement character)."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return "".join("\ufffd" if int(i) == self.vocab.unk_id else self.vocab[int(i)] for i in ids)


# ---------------------------------------------------------------------------------------------------------
# The merge rule, by hand
# ---------------------------------------------------------------------------------------------------------
def count_pairs(words: Mapping[tuple[str, ...], int]) -> Counter:
    """How often each pair of adjacent symbols occurs: ``{(a, b): count}``, each word weighted by its count.

    Args:
        words: each word spelt as a tuple of symbols -> how many times it occurs.
    """
    pairs: Counter = Counter()
    for symbols, count in words.items():
        for pair in zip(symbols, symbols[1:]):
            pairs[pair] += count
    return pairs


def merge_pair(words: Mapping[tuple[str, ...], int], pair: tuple[str, str]) -> dict[tuple[str, ...], int]:
    """Replace every occurrence of the adjacent ``pair`` by one symbol (left to right, non-overlapping)."""
    first, second = pair
    merged: dict[tuple[str, ...], int] = {}
    for symbols, count in words.items():
        out: list[str] = []
        i = 0
        while i < len(symbols):
            if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
                out.append(first + second)
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        key = tuple(out)
        merged[key] = merged.get(key, 0) + count
    return merged


# ---------------------------------------------------------------------------------------------------------
# BPE with the tokenizers library
# ---------------------------------------------------------------------------------------------------------
class BPETokenizer:
    """Byte-level BPE trained with Hugging Face's ``tokenizers`` on a list of texts.

    Args:
        texts: the training texts.
        vocab_size: the vocabulary size to reach: the 256 byte symbols plus ``vocab_size - 256`` merges.

    Attributes:
        tokenizer: the ``tokenizers.Tokenizer``.
        merges: the learned merges, in the order they were learned, as pairs of symbols.

    Symbols are written the byte-level way: a space is ``Ġ``, a newline ``Ċ``. Every one of the 256 bytes is a
    symbol of the vocabulary before any merge (GPT-2's initial alphabet), so a byte the training texts never
    contained (an accent, a CJK character, an emoji) still encodes, as its bytes, and decodes back.

    Raises:
        ValueError: ``vocab_size`` is not an int of at least 256, or ``texts`` is not a non-empty list.
    """

    def __init__(self, texts: Sequence[str], vocab_size: int = 512) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        check_int("vocab_size", vocab_size, minimum=BYTE_ALPHABET_SIZE)  # every byte is a symbol before any merge
        if isinstance(texts, str) or not texts:
            raise ValueError("texts must be a non-empty list of strings")
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        # All 256 byte symbols from the start (GPT-2's alphabet), not only the bytes the texts happen to hold:
        # without them a byte unseen in training has no token and silently vanishes from the decoded text.
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(texts, trainer=trainer)
        self.tokenizer = tokenizer
        self.merges: list[tuple[str, str]] = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                                              for m in _merges_of(tokenizer)]

    @classmethod
    def from_file(cls, path) -> BPETokenizer:
        """A tokenizer saved with ``tokenizer.tokenizer.save(path)`` (a Hugging Face ``tokenizer.json``)."""
        from tokenizers import Tokenizer

        self = cls.__new__(cls)
        self.tokenizer = Tokenizer.from_file(str(path))
        self.merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in _merges_of(self.tokenizer)]
        return self

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def pre_tokenize(self, text: str) -> list[str]:
        """The words the merges work inside (byte-level symbols: a leading space is ``Ġ``)."""
        return [piece for piece, _ in self.tokenizer.pre_tokenizer.pre_tokenize_str(text)]

    def encode(self, text: str) -> list[int]:
        """``text`` -> token ids."""
        return self.tokenizer.encode_batch_fast([text])[0].ids  # ids without character offsets

    def tokens(self, text: str) -> list[str]:
        """``text`` -> token strings (byte-level symbols)."""
        return self.tokenizer.encode(text).tokens

    def decode(self, ids: Iterable[int] | Tensor) -> str:
        """ids -> text (exactly the original text for any ids that ``encode`` produced)."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode([int(i) for i in ids])


def _merges_of(tokenizer) -> list:
    import json

    return json.loads(tokenizer.to_str())["model"]["merges"]
