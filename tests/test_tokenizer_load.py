"""Loading a tokenizer through the class `AutoTokenizer` chose before (`radixkv.tokenizer_load`):
the same class and the same tokens, text and chat prompts as `AutoTokenizer`, and no torch in a
process that only tokenizes."""

import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from radixkv import tokenizer_load
from radixkv.tokenizer_load import load_hf_tokenizer
from tests.tiny_models import tiny_chat_model_dir as _tiny_chat

SAMPLES = ["Hello world", "  two  spaces\tand a tab\n", "ünïcödé ✓ 你好", "<|im_start|>user\nhi<|im_end|>", ""]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


ORIGINAL_CACHE = os.environ.get("RADIXKV_CACHE_DIR")


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXKV_CACHE_DIR", str(tmp_path / "cache"))


def byte_level_dir(path, model_type: str, declared: str | None):
    """A small trained byte-level BPE tokenizer saved as a model directory whose
    `tokenizer_config.json` declares `declared` and whose `config.json` says `model_type`."""
    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(SAMPLES * 20 + ["the quick brown fox jumps over the lazy dog"] * 20,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", chat_template=TEMPLATE).save_pretrained(path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    if declared is None:
        config.pop("tokenizer_class", None)
    else:
        config["tokenizer_class"] = declared
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


def same_behaviour(a, b):
    assert type(a) is type(b)
    for text in SAMPLES:
        ids = a.encode(text)
        assert ids == b.encode(text)
        assert a.decode(ids) == b.decode(ids)
        assert a.decode(ids, skip_special_tokens=True) == b.decode(ids, skip_special_tokens=True)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert a.apply_chat_template(messages, tokenize=False) == b.apply_chat_template(messages, tokenize=False)
    assert (a.eos_token_id, a.bos_token_id, len(a)) == (b.eos_token_id, b.bos_token_id, len(b))


def auto_refused(monkeypatch):
    """From here on AutoTokenizer raises: a load that still works did not go through it."""
    def refuse(*args, **kwargs):
        raise AssertionError("AutoTokenizer was called")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", refuse)


@pytest.mark.parametrize("model_type,declared", [
    ("llama", "LlamaTokenizer"), ("llama", "LlamaTokenizerFast"), ("qwen2", "Qwen2Tokenizer"),
    ("qwen2", "TokenizersBackend"), ("gpt2", "GPT2Tokenizer"), ("gpt2", None), ("mistral", "PreTrainedTokenizerFast"),
])
def test_the_recorded_class_gives_what_auto_tokenizer_gives(tmp_path, monkeypatch, model_type, declared):
    directory = byte_level_dir(tmp_path / "model", model_type, declared)
    want = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    first = load_hf_tokenizer(directory)  # through AutoTokenizer: records its class
    same_behaviour(first, want)
    auto_refused(monkeypatch)
    same_behaviour(load_hf_tokenizer(directory), want)


def test_the_default_models_tokenizer(tmp_path_factory, monkeypatch, tmp_path):
    with monkeypatch.context() as m:  # the default model converted once, where the other tests find it
        m.delenv("RADIXKV_CACHE_DIR") if ORIGINAL_CACHE is None else m.setenv("RADIXKV_CACHE_DIR", ORIGINAL_CACHE)
        directory = _tiny_chat(tmp_path_factory)
    want = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    load_hf_tokenizer(directory)
    auto_refused(monkeypatch)
    same_behaviour(load_hf_tokenizer(directory), want)


def test_a_changed_directory_or_a_damaged_record_goes_through_auto_tokenizer(tmp_path, monkeypatch):
    directory = byte_level_dir(tmp_path / "model", "qwen2", "Qwen2Tokenizer")
    load_hf_tokenizer(directory)
    record = tokenizer_load._record_path(directory)
    assert json.loads(record.read_text()) == {"class": type(load_hf_tokenizer(directory)).__name__}
    config = directory / "tokenizer_config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # edited since
    assert tokenizer_load._record_path(directory) != record
    calls = []
    real = AutoTokenizer.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        calls.append(args[0])
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(counting))
    load_hf_tokenizer(directory)
    assert calls == [str(directory)]
    for damaged in ("not json", json.dumps({"class": "NoSuchTokenizer"}), json.dumps({"class": "os"}), "[]"):
        tokenizer_load._record_path(directory).write_text(damaged)
        load_hf_tokenizer(directory)
    assert len(calls) == 5  # each damaged record: AutoTokenizer again (and the record rewritten)
    load_hf_tokenizer(directory)
    assert len(calls) == 5


def test_a_process_that_only_tokenizes_does_not_import_torch(tmp_path):
    directory = byte_level_dir(tmp_path / "model", "llama", "LlamaTokenizer")
    code = ("import sys; from radixkv.tokenizer import Tokenizer; t = Tokenizer(sys.argv[1]); "
            "print(t.encode('hello world'), 'torch' in sys.modules)")
    env = {**os.environ, "RADIXKV_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code, str(directory)], env=env, capture_output=True, text=True,
                           check=True).stdout.split("] ") for _ in range(2)]
    assert runs[0][0] == runs[1][0]  # the same tokens
    assert [r[1].strip() for r in runs] == ["True", "False"]  # the first start resolves the class with torch
