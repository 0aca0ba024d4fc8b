"""vLLM engine. On CPU only the missing-dependency error runs; on a GPU with vllm installed
(`pip install compassplay[gpu]`) run: `pytest tests/engines/test_vllm.py -q`."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from compassplay.config import ConfigError
from compassplay.engines import SamplingParams, make_generation_engine
from compassplay.engines.logprobs import pack, token_logprobs
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from tests.tiny_models import tiny_causal_lm

HAS_VLLM = importlib.util.find_spec("vllm") is not None
GPU = HAS_VLLM and torch.cuda.is_available()


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_missing_vllm_is_a_clear_config_error():
    with pytest.raises(ConfigError) as err:
        make_generation_engine("vllm", "/nonexistent/model")
    msg = str(err.value)
    assert "vllm" in msg and "engine" in msg and "pip install compassplay[gpu]" in msg


def test_unknown_engine():
    with pytest.raises(ValueError, match="unknown generation engine"):
        make_generation_engine("tgi", None)


@pytest.mark.skipif(not GPU, reason="needs vllm and a CUDA GPU")
def test_vllm_generate_update_sleep(tmp_path):
    from compassplay.engines.vllm_generation import VLLMGenerationEngine

    model = tiny_causal_lm(seed=0, hidden_size=128)
    model.save_pretrained(tmp_path)
    build_byte_tokenizer().save_pretrained(tmp_path)
    eng = VLLMGenerationEngine(str(tmp_path), dtype="float32", gpu_memory_utilization=0.2,
                               enable_sleep_mode=True, enforce_eager=True)
    p = SamplingParams(max_new_tokens=8, temperature=0.8, seed=1)
    gens = eng.generate([[1, 2, 3], [7]], p)
    assert gens == eng.generate([[1, 2, 3], [7]], p)  # seeded
    for g in gens:
        b = pack([g])
        with torch.no_grad():
            ref = token_logprobs(model, b["input_ids"], b["attention_mask"], b["targets"])[0]
        torch.testing.assert_close(torch.tensor(g.logprobs), ref[b["mask"][0] > 0],
                                   atol=2e-3, rtol=0)
    new = tiny_causal_lm(seed=3, hidden_size=128).state_dict()
    eng.load_weights(new, 1)
    after = eng.generate([[1, 2, 3]], p)[0]
    assert after.weight_version == 1 and after.logprobs != gens[0].logprobs
    eng.sleep(level=1)
    eng.wake_up()
    assert eng.generate([[1, 2, 3]], p)[0] == after
    # colocated path: CUDA IPC handles of tensors on this process's GPU, while asleep
    from compassplay.engines.vllm_worker import device_uuid
    from compassplay.sync.ipc import publish

    eng.sleep(level=1)
    dev = torch.device("cuda", 0)
    with publish({device_uuid(dev): [(k, v.to(dev)) for k, v in new.items()]}, 2) as update:
        eng.load_weights_ipc(update.path, 2)
    again = eng.generate([[1, 2, 3]], p)[0]
    assert again.weight_version == 2 and again.completion_ids == after.completion_ids
    stop = eng.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, temperature=0.8, seed=1,
                                                     stop=[after.text[2:4]]))[0]
    assert stop.finish_reason == "stop"
