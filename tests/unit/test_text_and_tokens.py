"""The shared Vocabulary, the standard-library corpus, and the character and BPE tokenizers."""

import pytest
import torch

import attention_course as ac
from attention_course.tasks import phrases, reviews, translation
from attention_course.tasks.stdlib_text import load_stdlib_corpus
from attention_course.tokenization import BPETokenizer, CharTokenizer, count_pairs, merge_pair


def test_one_vocabulary_type_for_every_task():
    assert translation.Vocabulary is ac.Vocabulary
    assert isinstance(reviews.VOCAB, ac.Vocabulary)
    assert isinstance(phrases.SOURCE_VOCAB, ac.Vocabulary) and phrases.SOURCE_VOCAB[0] == "<pad>"
    vocab = ac.Vocabulary(["b", "a"], specials=("<pad>", "<unk>"))
    assert vocab.ids(["a", "zzz"]) == [3, 1] and vocab.unk_id == 1 and vocab.bos_id is None
    with pytest.raises(KeyError, match="zzz"):
        ac.Vocabulary(["a"]).encode(["zzz"])
    assert vocab.pad_batch([[2], [3, 2]]).tolist() == [[2, 0], [3, 2]]


def test_corpus_is_split_by_file_and_bounded(tmp_path):
    for index in range(30):
        (tmp_path / f"mod{index:02d}.py").write_text(f"x = {index}\n" * 10)
    (tmp_path / "notes.txt").write_text("not python")
    for fixture in ("__hello__.py", "__phello__.foo.py", "_sysconfigdata__linux.py"):
        (tmp_path / fixture).write_text("class TestFrozenUtf8_1:\n    pass\n")
    corpus = load_stdlib_corpus(max_train_chars=100, max_valid_chars=50, valid_every=3, directory=tmp_path)
    assert not set(corpus.train_files) & set(corpus.valid_files)
    assert min(corpus.train_files + corpus.valid_files) == "mod00.py" and "TestFrozen" not in corpus.train + corpus.valid
    assert str(tmp_path) not in repr(corpus) and f"from {tmp_path.name}/" in repr(corpus)
    assert corpus.valid_files and corpus.train_files
    assert len(corpus.train) < 100 + 70 and len(corpus.valid) < 50 + 70  # whole files until the cap
    again = load_stdlib_corpus(max_train_chars=100, max_valid_chars=50, valid_every=3, directory=tmp_path)
    assert again.train == corpus.train and again.valid_files == corpus.valid_files
    with pytest.raises(ValueError, match="no .py"):
        load_stdlib_corpus(directory=tmp_path / "empty")


def test_real_stdlib_corpus_has_text():
    corpus = load_stdlib_corpus(max_train_chars=20_000, max_valid_chars=5_000)
    assert len(corpus.train) >= 20_000 and len(corpus.valid) >= 5_000
    assert "def " in corpus.train
    assert str(corpus.directory) not in repr(corpus) and "the standard library of Python 3." in repr(corpus)


def test_char_tokenizer_round_trip():
    tokenizer = CharTokenizer("hello world\n")
    assert tokenizer.decode(tokenizer.encode("hello\nworld")) == "hello\nworld"
    assert tokenizer.encode("z") == [tokenizer.vocab.unk_id]
    assert len(tokenizer) == 1 + len(set("hello world\n"))


def test_hand_merges_match_the_trained_bpe():
    text = "low lower lowest newer newest wider " * 20 + "def f(x):\n    return x\n" * 10
    bpe = BPETokenizer([text], vocab_size=256 + 40)
    words = {}
    for word in bpe.pre_tokenize(text):
        words[tuple(word)] = words.get(tuple(word), 0) + 1
    for merge in bpe.merges[:3]:
        pairs = count_pairs(words)
        best = max(pairs.values())
        assert pairs[merge] == best  # the library merged a most frequent pair
        words = merge_pair(words, merge)
    assert bpe.decode(bpe.encode(text)) == text
    assert len(bpe.encode(text)) < len(text)
    assert merge_pair({("a", "a", "a"): 1}, ("a", "a")) == {("aa", "a"): 1}
    assert torch.tensor(bpe.encode("low")).dtype == torch.int64


def test_byte_level_bpe_round_trips_bytes_it_never_saw():
    """GPT-2's byte-level BPE: all 256 bytes are symbols, so text absent from training still round-trips."""
    bpe = BPETokenizer(["def f(x):\n    return x  # plain ASCII\n" * 20], vocab_size=256 + 20)
    assert len(bpe) == 276 and len(bpe.merges) == 20
    unseen = ["x = 5  # café", "naïve résumé", "東京タワー", "emoji 🙂🚀", "\x00\x7f\u0080\U0010ffff", ""]
    for text in unseen:
        ids = bpe.encode(text)
        assert bpe.decode(ids) == text, text
        # a character never seen in training is spelt as its UTF-8 bytes, one token each
        assert len(ids) <= len(text.encode("utf-8"))
    assert len(bpe.encode("🙂")) == len("🙂".encode()) == 4
    with pytest.raises(ValueError, match="256"):
        BPETokenizer(["abc"], vocab_size=255)
    with pytest.raises(ValueError, match="non-empty list"):
        BPETokenizer("abc", vocab_size=300)
