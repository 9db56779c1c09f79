"""One vocabulary type for every task of the course: tokens ↔ integer ids, special tokens first.

The translation task (chapter 10), the review classifier (chapter 09), the phrase task (chapter 01) and the
character tokenizer of chapter 13 all map tokens to ids the same way: a list of token strings (``itos``,
"id to string") and its inverse (``stoi``). Special tokens come first, so their ids are small and fixed:

=========================  ==========================================
task                        specials (ids 0, 1, 2)
=========================  ==========================================
translation, phrases        ``<pad>``, ``<bos>``, ``<eos>``
reviews                     ``<pad>``, ``<cls>``, ``<unk>``
characters (chapter 13)     ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``
=========================  ==========================================

A token may be any non-empty string (a word, a character, a space or a newline). Tokens that are not in the
vocabulary raise a ``KeyError`` unless the vocabulary has an ``<unk>`` token, which then stands for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

__all__ = ["BOS", "CLS", "EOS", "PAD", "UNK", "Vocabulary"]

#: The padding token, which fills sequences up to a batch's length; attention and the loss ignore it.
PAD = "<pad>"
#: The beginning-of-sequence token, the decoder's first input.
BOS = "<bos>"
#: The end-of-sequence token; generation stops when it is produced.
EOS = "<eos>"
#: Classification token of the encoder-only classifier (chapter 09).
CLS = "<cls>"
#: Stands for any token outside the vocabulary.
UNK = "<unk>"


class Vocabulary:
    """Tokens ↔ ids: ``specials`` first (ids 0, 1, ...), then ``tokens`` in the order given.

    Args:
        tokens: the ordinary tokens; duplicates are ignored.
        specials: the special tokens, first in the id order. The default is ``<pad>``, ``<bos>``, ``<eos>``.
        allow_spaces: whether a token may contain whitespace (characters and BPE pieces may; the words of
            the generated languages may not, since sentences are split on spaces).

    Attributes:
        itos: id -> token, a list.
        stoi: token -> id, a dict.
        pad_id: the id of ``<pad>``, or None if absent.
        bos_id: the id of ``<bos>``, or None if absent.
        eos_id: the id of ``<eos>``, or None if absent.
        cls_id: the id of ``<cls>``, or None if absent.
        unk_id: the id of ``<unk>``, or None if absent.

    Raises:
        ValueError: an empty or non-string token, a special token among ``tokens``, a token with whitespace
            when ``allow_spaces`` is False, or duplicate specials.
    """

    def __init__(
        self,
        tokens: Iterable[str] = (),
        specials: Sequence[str] = (PAD, BOS, EOS),
        allow_spaces: bool = False,
    ) -> None:
        specials = tuple(specials)
        if len(set(specials)) != len(specials):
            raise ValueError(f"special tokens must be distinct, got {specials}")
        self.specials = specials
        self.itos: list[str] = list(specials)
        self.stoi: dict[str, int] = {token: index for index, token in enumerate(specials)}
        for token in tokens:
            if not isinstance(token, str) or not token or (not allow_spaces and any(c.isspace() for c in token)):
                kind = "non-empty strings" + ("" if allow_spaces else " without spaces")
                raise ValueError(f"vocabulary tokens must be {kind}, got {token!r}")
            if token in specials:
                raise ValueError(f"{token!r} is a special token and cannot be an ordinary vocabulary token")
            if token not in self.stoi:
                self.stoi[token] = len(self.itos)
                self.itos.append(token)
        self.pad_id = self.stoi.get(PAD)
        self.bos_id = self.stoi.get(BOS)
        self.eos_id = self.stoi.get(EOS)
        self.cls_id = self.stoi.get(CLS)
        self.unk_id = self.stoi.get(UNK)

    # --- a sequence of tokens ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __getitem__(self, index: int) -> str:
        """The token with id ``index`` (so a vocabulary can be used where a list of tokens was)."""
        return self.itos[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self.itos)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Vocabulary):
            return self.itos == other.itos
        if isinstance(other, (list, tuple)):
            return self.itos == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking; compared by content

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} tokens: {' '.join(self.itos[:8])} ...)"

    # --- ids -----------------------------------------------------------------------------------------------
    def ids(self, tokens: Iterable[str]) -> list[int]:
        """The id of each token; unknown tokens become ``<unk>`` or raise ``KeyError`` when there is none."""
        tokens = list(tokens)
        if self.unk_id is not None:
            return [self.stoi.get(token, self.unk_id) for token in tokens]
        unknown = [token for token in tokens if token not in self.stoi]
        if unknown:
            raise KeyError(f"tokens not in the vocabulary: {unknown}")
        return [self.stoi[token] for token in tokens]

    def encode(self, sentence: str | Sequence[str], add_bos: bool = True, add_eos: bool = True) -> list[int]:
        """Ids of a sentence (a string of space-separated words, or a list of tokens), framed by bos/eos.

        ``add_bos``/``add_eos`` are ignored when the vocabulary has no such token.

        Raises:
            KeyError: a word is not in the vocabulary and there is no ``<unk>`` token.
        """
        words = sentence.split() if isinstance(sentence, str) else list(sentence)
        ids = self.ids(words)
        front = [self.bos_id] if add_bos and self.bos_id is not None else []
        back = [self.eos_id] if add_eos and self.eos_id is not None else []
        return front + ids + back

    def _id_list(self, ids: Iterable[int] | Tensor) -> list[int]:
        if isinstance(ids, Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode takes one sequence of ids (1-D), got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = [int(index) for index in ids]
        for index in ids:
            if not 0 <= index < len(self.itos):
                raise ValueError(f"id {index} is outside the vocabulary of {len(self.itos)} tokens")
        return ids

    def decode_tokens(self, ids: Iterable[int] | Tensor, strip_special: bool = True) -> list[str]:
        """The tokens of ``ids``: stops at the first eos and drops bos and padding, unless ``strip_special``
        is False (then every token is written out)."""
        tokens = []
        for index in self._id_list(ids):
            if strip_special:
                if index == self.eos_id:
                    break
                if index in (self.pad_id, self.bos_id):
                    continue
            tokens.append(self.itos[index])
        return tokens

    def decode(self, ids: Iterable[int] | Tensor, strip_special: bool = True) -> str:
        """The sentence of a sequence of ids, tokens joined by single spaces (see :meth:`decode_tokens`)."""
        return " ".join(self.decode_tokens(ids, strip_special))

    def tokens(self, ids: Iterable[int] | Tensor) -> list[str]:
        """The token strings of ``ids``, special tokens included (labels for attention plots)."""
        if isinstance(ids, Tensor):
            ids = ids.tolist()
        return [self.itos[int(index)] for index in ids]

    def pad_batch(self, sequences: Sequence[Sequence[int]], length: int | None = None) -> Tensor:
        """Right-pad id lists with ``<pad>`` into one ``(N, L)`` tensor; ``L`` is the longest or ``length``.

        Raises:
            ValueError: no sequences, no ``<pad>`` token, or a sequence longer than ``length``.
        """
        if len(sequences) == 0:
            raise ValueError("pad_batch needs at least one sequence")
        if self.pad_id is None:
            raise ValueError("this vocabulary has no <pad> token")
        longest = max(len(sequence) for sequence in sequences)
        length = longest if length is None else length
        if longest > length:
            raise ValueError(f"a sequence has {longest} tokens, more than length={length}")
        out = torch.full((len(sequences), length), self.pad_id, dtype=torch.long)
        for row, sequence in enumerate(sequences):
            out[row, : len(sequence)] = torch.as_tensor(list(sequence), dtype=torch.long)
        return out
