"""The static decoder against the plain forward of the same module (the oracle): logits of a
prefill and of every decode step, with left padding and repeated prompts, Llama and Qwen2;
greedy generations equal the module-forward decoder's; weights followed after they change."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from compassplay.config import TinyModelConfig
from compassplay.engines import SamplingParams
from compassplay.engines.generation.base import Segment
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.static_decoder import StaticDecoder, unsupported_reason
from compassplay.models.loading import tiny_config


def tiny(arch: str, seed: int = 0) -> torch.nn.Module:
    t = TinyModelConfig(arch=arch, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                        intermediate_size=96, max_positions=256, tie_embeddings=arch == "qwen2")
    cfg = tiny_config(t, 260, pad_id=259, eos_id=258)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).float().eval()


def oracle_logits(model: torch.nn.Module, rows: list[list[int]]) -> torch.Tensor:
    """The module's forward on each row alone, no padding, no cache: last logits [B, V]."""
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([r])).logits[:, -1].float()
                          for r in rows])


def left_pad(rows: list[list[int]], pad_id: int = 259) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    return ids, torch.tensor([width - len(r) for r in rows])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("pack", [True, False])
def test_prefill_and_steps_match_the_module_forward(arch, pack):
    model = tiny(arch)
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43]]
    dec = StaticDecoder(model, pack=pack)
    ids, pad = left_pad(rows)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        logits = dec.start(ids, pad, ids.shape[1] + 6)
        for _ in range(6):
            torch.testing.assert_close(logits, oracle_logits(model, rows), atol=1e-4, rtol=1e-4)
            tok = torch.randint(0, 258, (len(rows),), generator=g)
            rows = [r + [t] for r, t in zip(rows, tok.tolist(), strict=True)]
            if dec._t < ids.shape[1] + 6:
                logits = dec.step(tok)
    with pytest.raises(ValueError, match="full"):
        dec.step(tok)


def test_greedy_generations_equal_the_module_forward_decoder(tokenizer):
    model = tiny("qwen2", seed=3)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [5, 6, 7], [70]]
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    a = HFGenerationEngine(model, tokenizer, decoder="static").generate(prompts, greedy)
    b = HFGenerationEngine(model, tokenizer, decoder="hf").generate(prompts, greedy)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    for x, y in zip(a, b, strict=True):
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
    templ = SamplingParams(max_new_tokens=40, temperature=0.9, seed=1,
                           template=(Segment("```", "\n", 10), Segment("```", "", 8)))
    s1 = HFGenerationEngine(model, tokenizer).generate(prompts, templ)
    s2 = HFGenerationEngine(model, tokenizer).generate(prompts, templ)
    assert [g.completion_ids for g in s1] == [g.completion_ids for g in s2]  # seeded
    assert all(g.finish_reason == "stop" and g.text.count("```") == 2 for g in s1)


def test_weights_changed_in_place_are_followed(tokenizer):
    model = tiny("llama")
    engine = HFGenerationEngine(model, tokenizer)
    assert engine.decoder == "static"
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate([[5, 6, 7]], greedy)[0]
    with torch.no_grad():  # an optimizer step on a shared module: written in place
        model.model.layers[0].mlp.up_proj.weight.mul_(3.0)
        model.model.layers[1].self_attn.k_proj.weight.add_(0.5)
    after = engine.generate([[5, 6, 7]], greedy)[0]
    assert after.logprobs != before.logprobs
    oracle = HFGenerationEngine(model, tokenizer, decoder="hf").generate([[5, 6, 7]], greedy)[0]
    assert after.completion_ids == oracle.completion_ids
    engine.load_weights(tiny("llama", seed=9).state_dict(), 1)
    fresh = HFGenerationEngine(tiny("llama", seed=9), tokenizer, decoder="hf")
    assert engine.generate([[5, 6, 7]], greedy)[0].completion_ids == \
        fresh.generate([[5, 6, 7]], greedy)[0].completion_ids


def test_other_architectures_fall_back_to_the_module_forward(tokenizer):
    gpt2 = tiny("gpt2")
    assert "gpt2" in unsupported_reason(gpt2)
    with pytest.raises(ValueError, match="StaticDecoder"):
        StaticDecoder(gpt2)
    engine = HFGenerationEngine(gpt2, tokenizer)
    assert engine.decoder == "hf"
    assert HFGenerationEngine(gpt2, tokenizer, decoder="static").decoder == "hf"  # logged
    assert len(engine.generate([[5, 6]], SamplingParams(max_new_tokens=3))[0].completion_ids) \
        >= 1
    with pytest.raises(ValueError, match="decoder"):
        HFGenerationEngine(gpt2, tokenizer, decoder="fast")


def test_bfloat16_decoding_stays_close_to_float32_and_keeps_sampling_valid(tokenizer):
    """decode_dtype=bfloat16: teacher-forced next-token distributions within a small KL of
    the float32 decoder's (the same arithmetic in float32 gives exactly 0), seeded sampling
    reproducible, templated output valid, weights followed after an in-place change."""
    from compassplay.bench.decode_dtype import compare_decode_dtypes

    model = tiny("qwen2", seed=3)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]
    same = compare_decode_dtypes(model, prompts, 12, dtype=torch.float32)
    assert same["top1_agreement"] == 1.0 and same["kl_max_nats"] == 0.0
    low = compare_decode_dtypes(model, prompts, 12)
    assert low["positions"] == 24 and 0.0 < low["kl_mean_nats"] < 1e-3, low
    assert low["max_abs_logit_diff"] > 0.0
    engine = HFGenerationEngine(model, tokenizer, decode_dtype="bfloat16")
    assert engine.decoder == "static" and engine.decode_dtype == "bfloat16"
    assert engine._decoder.head.dtype == torch.bfloat16
    templ = SamplingParams(max_new_tokens=40, temperature=0.9, seed=1,
                           template=(Segment("```", "\n", 10), Segment("```", "", 8)))
    s1 = engine.generate(prompts, templ)
    s2 = HFGenerationEngine(model, tokenizer, decode_dtype="bfloat16").generate(prompts, templ)
    assert [g.completion_ids for g in s1] == [g.completion_ids for g in s2]
    assert all(g.finish_reason == "stop" and g.text.count("```") == 2 for g in s1)
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(3.0)
    assert engine._decoder.refresh_if_changed()
    assert engine._decoder.blocks[0].wgu.dtype == torch.bfloat16


def test_decode_dtype_auto_takes_bfloat16_only_where_it_is_faster(monkeypatch, tmp_path):
    from compassplay.engines import dtype_choice as dc

    model = tiny("llama")
    assert dc.resolve_decode_dtype("model", model) is None
    assert dc.resolve_decode_dtype("bfloat16", model) is torch.bfloat16
    with pytest.raises(ValueError, match="decode_dtype"):
        dc.resolve_decode_dtype("fp8", model)
    timings = {torch.float32: 2.0, torch.bfloat16: 1.0}
    calls = []
    monkeypatch.setattr(dc, "decode_matmul_seconds", lambda m, **kw: calls.append(1) or dict(timings))
    assert dc.resolve_decode_dtype("auto", model, tmp_path / "a") is torch.bfloat16
    timings[torch.float32] = 1.2  # under the 1.25x margin
    assert dc.resolve_decode_dtype("auto", model, tmp_path / "b") is None
    timings[torch.float32] = 9.0
    assert dc.resolve_decode_dtype("auto", tiny("gpt2"), tmp_path / "c") is None  # no static
    assert dc.resolve_decode_dtype("auto", tiny("llama").to(torch.bfloat16), tmp_path / "c") \
        is None
    assert len(calls) == 2  # neither refusal measured
    monkeypatch.undo()
    t = dc.decode_matmul_seconds(model, reps=2)  # the real timing runs, both dtypes
    assert t[torch.float32] > 0 and t[torch.bfloat16] > 0


def test_a_cpu_where_onednn_has_no_bfloat16_times_and_decodes_bfloat16_unpacked(monkeypatch):
    """oneDNN packs bfloat16 only on AVX512 (BW/VL/DQ) or AVX-NE-CONVERT CPUs; on an AVX2-only
    one its reorder raises. There `pack_kind` gives None, the "auto" timing runs bfloat16 on
    `F.linear` (and so picks float32 there), and a bfloat16 decoder still decodes."""
    from compassplay.engines import dtype_choice as dc
    from compassplay.engines.generation import decoder_support as ds

    real = ds.onednn_bf16_supported()
    assert (ds.pack_kind(torch.bfloat16) == "onednn") == real
    monkeypatch.setattr(ds, "onednn_bf16_supported", lambda: False)
    assert ds.pack_kind(torch.bfloat16) is None
    model = tiny("llama")
    t = dc.decode_matmul_seconds(model, reps=1)
    assert t[torch.float32] > 0 and t[torch.bfloat16] > 0
    dec = StaticDecoder(model, dtype=torch.bfloat16)
    assert dec.pack is None
    ids, pad = left_pad([[5, 6, 7], [8, 9]])
    with torch.no_grad():
        dec.start(ids, pad, 6)
        assert torch.isfinite(dec.step(torch.tensor([1, 2]))).all()


def test_the_float32_packing_is_measured_kept_and_used_by_the_engine(monkeypatch, tmp_path,
                                                                    tokenizer):
    """The kept entry names the faster float32 packing of those this torch has, with each
    one's time; `resolve_float32_pack` reads it, and an entry from before it (no
    `float32_pack`) is measured again. The engine's float32 decoder packs that way, and both
    packings give the module forward's logits."""
    from compassplay.engines import dtype_choice as dc
    from compassplay.engines.generation.decoder_support import pack_kind

    model = tiny("llama")
    have = [k for k in ("mkl", "onednn") if pack_kind(torch.float32, k) == k]
    fake = {"mkl": 2.0, "onednn": 1.0}
    monkeypatch.setattr(dc, "float32_pack_seconds",
                        lambda m: {k: fake[k] for k in have})
    want = min(have, key=fake.get)
    assert dc.resolve_float32_pack(model, tmp_path) == want
    entry = next(iter(json.loads((tmp_path / dc.CACHE_FILE).read_text()).values()))
    assert entry["float32_pack"] == want and set(entry["float32_pack_ms"]) == set(have)
    fake.update(mkl=0.5)  # kept: a later timing does not change it
    assert dc.resolve_float32_pack(model, tmp_path) == want
    key = dc.machine_key(model)
    old = {key: {k: v for k, v in entry.items() if not k.startswith("float32_pack")}}
    (tmp_path / dc.CACHE_FILE).write_text(json.dumps(old))
    assert dc.resolve_float32_pack(model, tmp_path) == min(have, key=fake.get)  # measured again
    monkeypatch.setenv("COMPASSPLAY_CACHE", str(tmp_path))
    engine = HFGenerationEngine(model, tokenizer)
    assert engine.static_decoder.pack == min(have, key=fake.get)
    rows = [[5, 6, 7, 8], [9, 10]]
    ids, pad = left_pad(rows)
    for kind in have:
        dec = StaticDecoder(model, float32_pack=kind)
        assert dec.pack == kind
        with torch.no_grad():
            dec.start(ids, pad, ids.shape[1] + 2)
            tok = torch.tensor([3, 4])
            got = dec.step(tok)
        torch.testing.assert_close(got, oracle_logits(model, [r + [t] for r, t in
                                                              zip(rows, [3, 4], strict=True)]),
                                   atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="float32 packing 'fast'"):
        StaticDecoder(model, float32_pack="fast")


def test_the_engine_reads_its_dtype_and_packing_from_one_read_of_the_kept_entry(
        monkeypatch, tmp_path):
    """`resolve_decoding` gives what `resolve_decode_dtype` and `resolve_float32_pack` give,
    for a float32 and a bfloat16 choice, and reads the kept file once where they read it
    twice."""
    from compassplay.engines import dtype_choice as dc

    model = tiny("llama")
    timings = {torch.float32: 1.0, torch.bfloat16: 2.0}  # float32 faster: auto keeps it
    monkeypatch.setattr(dc, "decode_matmul_seconds", lambda m, **kw: dict(timings))
    monkeypatch.setattr(dc, "float32_pack_seconds", lambda m: {"mkl": 2.0, "onednn": 1.0}
                        if dc.onednn_available() else {"mkl": 1.0})
    want = (dc.resolve_decode_dtype("auto", model, tmp_path),
            dc.resolve_float32_pack(model, tmp_path))
    assert want[0] is None
    reads = []
    real_read = dc._read
    monkeypatch.setattr(dc, "_read", lambda path: reads.append(path) or real_read(path))
    assert dc.resolve_decoding("auto", model, tmp_path) == want
    assert len(reads) == 1
    assert dc.resolve_decoding("bfloat16", model, tmp_path) == (torch.bfloat16, "mkl")
    assert len(reads) == 1  # a bfloat16 decoder needs no packing: nothing read
    with pytest.raises(ValueError, match="decode_dtype"):
        dc.resolve_decoding("fp8", model, tmp_path)


def test_decode_dtype_auto_is_measured_once_per_machine_and_kept(monkeypatch, tmp_path):
    """The first run's choice is written to the cache and every later one reads it, whatever
    a later timing would say (the choice flipped between runs under load before)."""
    from compassplay.engines import dtype_choice as dc

    model = tiny("llama")
    timings = {torch.float32: 3.0, torch.bfloat16: 1.0}
    calls = []
    monkeypatch.setattr(dc, "decode_matmul_seconds", lambda m, **kw: calls.append(1) or dict(timings))
    assert dc.resolve_decode_dtype("auto", model, tmp_path) is torch.bfloat16
    timings[torch.bfloat16] = 9.0  # a later timing under load would pick float32
    assert dc.resolve_decode_dtype("auto", model, tmp_path) is torch.bfloat16
    assert len(calls) == 1
    kept = json.loads((tmp_path / dc.CACHE_FILE).read_text())
    (key, entry), = kept.items()
    assert key == dc.machine_key(model) and "threads" in key and entry["dtype"] == "bfloat16"
    assert entry["float32_ms"] == 3000.0 and entry["bfloat16_ms"] == 1000.0
    (tmp_path / dc.CACHE_FILE).write_text("{not json")  # a damaged file is measured again
    assert dc.resolve_decode_dtype("auto", model, tmp_path) is None
    assert len(calls) >= 2
    assert json.loads((tmp_path / dc.CACHE_FILE).read_text())[key]["dtype"] == "float32"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bfloat16_packed_matmuls_and_transposed_keys_change_no_logit(arch):
    """The bfloat16 decode steps' matmuls on weights packed for the batch's rows (oneDNN,
    `pack_kind`) and attention on transposed cached keys give the same logits, bit for bit,
    as `F.linear` on the plain copies and keys cached [C, d]."""
    from compassplay.engines.generation.static_decoder import pack_kind

    if pack_kind(torch.bfloat16) is None:
        pytest.skip("no oneDNN packing for bfloat16 on this CPU or torch build")
    model = tiny(arch, seed=5)
    rows = [[5, 6, 7, 8, 9], [12, 13], [40, 41, 42, 43]]
    ids, pad = left_pad(rows)
    packed = StaticDecoder(model, dtype=torch.bfloat16)
    plain = StaticDecoder(model, dtype=torch.bfloat16, pack=False)
    plain.keys_transposed = False  # and the keys in their [C, d] layout
    assert packed.pack == "onednn" and plain.pack is None and packed.keys_transposed
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        a = packed.start(ids, pad, ids.shape[1] + 5)
        b = plain.start(ids, pad, ids.shape[1] + 5)
        for _ in range(4):
            assert torch.equal(a, b)
            tok = torch.randint(0, 258, (len(rows),), generator=g)
            a, b = packed.step(tok), plain.step(tok)
        assert torch.equal(a, b)
    assert len(packed._packed[len(rows)]) == 4 * 2 + 1  # four per block and the head


_MEASURE_SCRIPT = """
import sys, time, torch
from compassplay.engines import dtype_choice as dc
from tests.engines.generation.test_static_decoder import tiny

def slow(model, **kw):
    print("MEASURED", flush=True)
    time.sleep(1.0)  # long enough for the other processes to arrive while this one measures
    return {torch.float32: 3.0, torch.bfloat16: 1.0}

dc.decode_matmul_seconds = slow
print(dc.measured_choice(tiny("llama"), __import__("pathlib").Path(sys.argv[1]))["dtype"])
"""


def test_processes_starting_at_once_measure_the_decode_dtype_once(tmp_path):
    """Actors starting together: one measures, the others wait on the cache folder's lock and
    read its entry (each measuring would log, and could keep, a different answer)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    procs = [subprocess.Popen([sys.executable, "-c", _MEASURE_SCRIPT, str(tmp_path / "c")],
                              cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    printed = "".join(o for o, _ in outs)
    assert printed.count("MEASURED") == 1, printed
    assert printed.split().count("bfloat16") == 3
    assert len(json.loads((tmp_path / "c" / "decode_dtype.json").read_text())) == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rope_and_rms_norm_equal_the_modules_own_bit_for_bit(arch):
    """`_rope` on the signed sine table and `_rms` written in the matmul dtype give the HF
    modules' apply_rotary_pos_emb and RMSNorm outputs exactly (float32 and bfloat16)."""
    from transformers.models.llama.modeling_llama import rotate_half

    model = tiny(arch)
    for dtype in (torch.float32, torch.bfloat16):
        dec = StaticDecoder(model, dtype=dtype)
        dec._alloc(3, torch.zeros(3, dtype=torch.long), 16, torch.device("cpu"))
        cos, sin = model.model.rotary_emb(torch.zeros(1, 1, 64), torch.arange(16)[None])
        x = torch.randn(3, 6, 16, dec.d)
        want = (x * cos[0] + rotate_half(x) * sin[0]).to(dtype)
        assert torch.equal(dec._rope(x.clone(), dec._cos, dec._sin), want)
        h = torch.randn(3, 5, 64)
        norm = model.model.layers[0].input_layernorm
        with torch.no_grad():
            norm.weight.copy_(torch.rand(64) + 0.5)
            want = norm(h).to(dtype)
        got = dec._rms(h, norm.weight.detach().float())
        assert got.dtype == dtype and torch.equal(got, want)
