"""The course model: its recipe, its checkpoint format, and the files shipped in the package.

`make test` never retrains: it checks the shipped files against their recorded hashes, loads them with the
course's loader and with `transformers`, and re-runs the recipe's first steps from its seed.
"""

import json
import platform
import shutil

import pytest
import torch

import attention_course as ac
from attention_course import course_model as cm
from attention_course.tasks.stdlib_text import load_stdlib_corpus
from attention_course.tokenization import BPETokenizer

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements.txt)")


def _tiny_llama(tied: bool = True) -> ac.DecoderOnlyLM:
    torch.manual_seed(0)
    config = ac.ModelConfig(positions="rotary", rotary_pairing="half", num_kv_heads=2, norm="rmsnorm",
                            feed_forward="swiglu", bias=False)
    model = ac.DecoderOnlyLM(61, d_model=32, num_heads=4, num_layers=2, d_ff=48, max_len=40, positions="none",
                             tie_weights=tied, config=config)
    with torch.no_grad():  # RMSNorm gains start at 1; make them differ so a swapped norm would show
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize("tied", [True, False])
def test_a_saved_llama_checkpoint_gives_the_same_logits_in_the_loader_and_in_transformers(tmp_path, tied):
    model = _tiny_llama(tied)
    cm.save_llama_checkpoint(model, tmp_path, dtype=torch.float32)
    tokens = torch.randint(0, 61, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(tokens)
        reloaded = ac.load_hf_checkpoint(tmp_path)(tokens)
        theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()(tokens).logits
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is tied
    torch.testing.assert_close(reloaded, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs, expected, atol=1e-4, rtol=0)


def test_a_bfloat16_checkpoint_holds_the_weights_rounded_to_bfloat16(tmp_path):
    model = _tiny_llama()
    cm.save_llama_checkpoint(model, tmp_path)  # bfloat16 by default, as shipped
    reloaded = ac.load_hf_checkpoint(tmp_path)
    original = model.blocks[1].self_attention.w_k.weight
    torch.testing.assert_close(reloaded.blocks[1].self_attention.w_k.weight, original.to(torch.bfloat16).float())
    assert not torch.equal(reloaded.blocks[1].self_attention.w_k.weight, original)


def test_only_a_llama_style_model_can_be_saved_as_a_llama_checkpoint(tmp_path):
    gpt_like = ac.DecoderOnlyLM(20, d_model=16, num_heads=2, num_layers=1, max_len=8)
    with pytest.raises(ValueError, match="Llama-style.*'norm': 'layernorm'"):
        cm.save_llama_checkpoint(gpt_like, tmp_path)


def _checksummed_copy(tmp_path):
    model = _tiny_llama()
    folder = tmp_path / "model"
    cm.save_llama_checkpoint(model, folder)
    BPETokenizer(["def f(x):\n    return x + 1\n"], vocab_size=260).tokenizer.save(str(folder / "tokenizer.json"))
    sums = {name: cm._sha256(folder / name) for name in ("config.json", "model.safetensors", "tokenizer.json")}
    return folder, sums


def test_load_course_model_checks_every_file_against_its_recorded_hash(tmp_path):
    folder, sums = _checksummed_copy(tmp_path)
    model, tokenizer = cm.load_course_model(folder, checksums=sums)
    assert isinstance(model, ac.DecoderOnlyLM) and not model.training
    assert tokenizer.decode(tokenizer.encode("def g(y):\n")) == "def g(y):\n"

    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="'model.safetensors'.*changed or damaged"):
        cm.load_course_model(folder, checksums=sums)

    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="'model.safetensors' is missing"):
        cm.load_course_model(folder, checksums=sums)


def test_a_bpe_tokenizer_reloads_from_its_file_with_the_same_merges(tmp_path):
    tokenizer = BPETokenizer(["for item in items:\n    print(item)\n"] * 3, vocab_size=270)
    tokenizer.tokenizer.save(str(tmp_path / "tokenizer.json"))
    again = BPETokenizer.from_file(tmp_path / "tokenizer.json")
    assert again.merges == tokenizer.merges and len(again) == len(tokenizer)
    text = "for x in xs:\n    print(x, 'é')\n"
    assert again.encode(text) == tokenizer.encode(text) and again.decode(again.encode(text)) == text


def test_the_corpus_with_packages_reads_package_files_but_not_test_suites(tmp_path):
    (tmp_path / "pkg" / "tests").mkdir(parents=True)
    (tmp_path / "site-packages" / "third").mkdir(parents=True)
    for name in ("alpha.py", "beta.py", "pkg/gamma.py", "pkg/delta.py", "pkg/tests/test_x.py",
                 "site-packages/third/mod.py"):
        (tmp_path / name).write_text(f"# {name}\nx = 1")
    top_only = load_stdlib_corpus(directory=tmp_path, valid_every=2)
    both = load_stdlib_corpus(directory=tmp_path, valid_every=2, packages=True)
    files = both.train_files + both.valid_files
    assert sorted(files) == ["alpha.py", "beta.py", "pkg/delta.py", "pkg/gamma.py"]
    # top-level files fall on the same side either way, and come first
    assert both.train_files[: len(top_only.train_files)] == top_only.train_files
    assert both.valid_files[: len(top_only.valid_files)] == top_only.valid_files
    assert "".join(both.file_texts("train")) == both.train and "".join(both.file_texts("valid")) == both.valid
    with pytest.raises(TypeError, match="packages must be a bool"):
        load_stdlib_corpus(directory=tmp_path, packages="yes")


def test_the_evaluation_text_is_the_first_characters_of_the_validation_files():
    corpus = cm.course_corpus()
    pieces = cm.evaluation_text(corpus, 5_000)
    assert "".join(pieces) == corpus.valid[:5_000]
    assert not set(corpus.train_files) & set(corpus.valid_files)
    assert any("/" in name for name in corpus.train_files)  # packages are read
    assert not any("/test/" in f"/{name}" or "/tests/" in f"/{name}" for name in corpus.train_files)


# ---------------------------------------------------------------------------------------------------------
# The shipped files
# ---------------------------------------------------------------------------------------------------------
def test_the_shipped_model_matches_its_hashes_and_loads_equally_in_transformers():
    model, tokenizer = ac.load_course_model()
    assert set(cm.CHECKSUMS) >= {"config.json", "model.safetensors", "tokenizer.json"}
    size = sum((cm.COURSE_MODEL_DIR / name).stat().st_size for name in cm.CHECKSUMS)
    assert size < 20 * 2**20, f"the shipped model takes {size / 2**20:.1f} MiB, over the 20 MB budget"
    text = "def area(width, height):\n    return width * height\n"
    ids = torch.tensor([tokenizer.encode(text)])
    theirs = transformers.LlamaForCausalLM.from_pretrained(cm.COURSE_MODEL_DIR, dtype=torch.float32).eval()
    hf_tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(cm.COURSE_MODEL_DIR / "tokenizer.json"))
    assert hf_tokenizer(text)["input_ids"] == ids[0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, model(ids), atol=1e-4, rtol=0)


def test_the_recipe_reproduces_the_logged_first_steps_from_its_seed(tmp_path):
    log = json.loads((cm.COURSE_MODEL_DIR / "training_log.json").read_text())
    if log["python"].rsplit(".", 1)[0] != platform.python_version().rsplit(".", 1)[0]:
        pytest.skip(f"the course model was trained on Python {log['python']}'s standard library; this is "
                    f"Python {platform.python_version()}, whose library (the training text) differs")
    steps = 3
    run = cm.train_course_model(tmp_path, max_steps=steps)
    assert run.log["train_sha256"] == log["train_sha256"], "the training text differs from the logged run's"
    shipped = json.loads((cm.COURSE_MODEL_DIR / "tokenizer.json").read_text())
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"] == shipped["model"]
    assert run.log["first_losses"] == pytest.approx(log["first_losses"][:steps], abs=2e-3)
    assert run.log["first_losses"][-1] < run.log["first_losses"][0]
    shutil.rmtree(tmp_path)
