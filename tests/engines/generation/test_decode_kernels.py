"""The fused C decode kernels against the torch ops they replace (the oracle: the same
bfloat16 or float32 decoder on torch ops, and the float32 module forward), their build and
cache, the fallback where no compiler builds them, and the OpenMP runtime they share with
torch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from compassplay.config import TinyModelConfig
from compassplay.engines import SamplingParams
from compassplay.engines.generation import decode_kernels as dk
from compassplay.engines.generation.base import Segment
from compassplay.engines.generation.hf import HFGenerationEngine
from compassplay.engines.generation.static_decoder import StaticDecoder
from compassplay.models.loading import tiny_config

pytestmark = pytest.mark.skipif(dk.load() is None, reason="no C compiler builds the kernels")


def model_with(arch: str, heads: int, kv_heads: int, hidden: int, seed: int = 0
               ) -> torch.nn.Module:
    """A random 2-block model; head dim = hidden / heads (64 at SmolLM2's 576 / 9)."""
    t = TinyModelConfig(arch=arch, hidden_size=hidden, num_layers=2, num_heads=heads,
                        num_kv_heads=kv_heads, intermediate_size=2 * hidden, max_positions=512,
                        tie_embeddings=arch == "qwen2")
    cfg = tiny_config(t, 260, pad_id=259, eos_id=258)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(cfg).float().eval()


def left_pad(rows: list[list[int]], pad_id: int = 259) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    return ids, torch.tensor([width - len(r) for r in rows])


def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """KL(softmax a || softmax b) per row (nats)."""
    la, lb = torch.log_softmax(a, -1), torch.log_softmax(b, -1)
    return (la.exp() * (la - lb)).sum(-1)


SHAPES = [("llama", 4, 2, 64), ("qwen2", 4, 2, 64), ("llama", 3, 1, 192), ("qwen2", 2, 2, 128)]


@pytest.mark.parametrize("arch,heads,kv_heads,hidden", SHAPES)
def test_fused_steps_follow_the_torch_ops_and_the_float32_forward(arch, heads, kv_heads,
                                                                  hidden):
    """Left padding, repeated prompts, rows dropped by `keep`, 40 steps: logits within
    bfloat16 rounding of the torch-op decoder's (KL < 1e-3 nats per position, where the
    bfloat16 decoders are each as far from float32's), the cache's keys and values equal but
    for a few entries that differ by bfloat16 roundings."""
    model = model_with(arch, heads, kv_heads, hidden, seed=7)
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43]]
    ids, pad = left_pad(rows)
    fused = StaticDecoder(model, dtype=torch.bfloat16, kernels="c")
    ops = StaticDecoder(model, dtype=torch.bfloat16)
    ref = StaticDecoder(model)
    assert (fused.kernels, ops.kernels, ref.kernels) == ("c", "torch", "torch")
    g = torch.Generator().manual_seed(3)
    worst_ops, worst_ref, worst_fused_ref = 0.0, 0.0, 0.0
    with torch.no_grad():
        a, b, c = (d.start(ids, pad, ids.shape[1] + 40) for d in (fused, ops, ref))
        # the prefill is the same code but for its head matmul (4 rows: `small_linear`)
        assert float((a - b).abs().max() / b.abs().max()) < 1e-5
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        for step in range(40):
            tok = torch.randint(0, 258, (len(a),), generator=g)
            if step == 20:  # the engine drops finished rows
                keep = torch.tensor([3, 0, 2])
                for d in (fused, ops, ref):
                    d.keep(keep)
                tok = tok[keep]
            a, b, c = fused.step(tok), ops.step(tok), ref.step(tok)
            worst_ops = max(worst_ops, float(kl(b, a).max()))
            worst_ref = max(worst_ref, float(kl(c, b).max()))
            worst_fused_ref = max(worst_fused_ref, float(kl(c, a).max()))
        for got, want in ((fused._k, ops._k), (fused._v, ops._v)):
            diff = (got.float() - want.float()).abs()
            assert float((diff > 0).float().mean()) < 0.05
            assert float(diff.max()) < 0.02 * float(want.float().abs().max())
    assert worst_ops < 1e-3 and worst_fused_ref < 1e-3, (worst_ops, worst_ref, worst_fused_ref)
    assert worst_fused_ref < 3 * worst_ref + 1e-5  # no farther from float32 than torch ops


@pytest.mark.parametrize("arch,heads,kv_heads,hidden", SHAPES)
def test_float32_fused_steps_equal_the_float32_torch_ops_up_to_summation_order(
        arch, heads, kv_heads, hidden):
    """The float32 library (CPUs without fast bfloat16): nothing is rounded, so over 40 steps
    with left padding, repeated prompts and rows dropped by `keep` the logits stay within
    float32 summation-order noise of the torch-op decoder's (1e-5 of their scale), with the
    same top-1 at every position, and the cache holds the same keys and values."""
    model = model_with(arch, heads, kv_heads, hidden, seed=7)
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [5, 6, 7, 8, 9, 10, 11], [40, 41, 42, 43]]
    ids, pad = left_pad(rows)
    fused, ops = StaticDecoder(model, kernels="c"), StaticDecoder(model)
    assert (fused.kernels, ops.kernels) == ("c", "torch")
    assert fused.keys_transposed and not ops.keys_transposed
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    with torch.no_grad():
        a, b = (d.start(ids, pad, ids.shape[1] + 40) for d in (fused, ops))
        # the prefill is the same code but for its head matmul (4 rows: `small_linear`)
        assert float((a - b).abs().max() / b.abs().max()) < 1e-5
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        for step in range(40):
            tok = torch.randint(0, 258, (len(a),), generator=g)
            if step == 20:
                keep = torch.tensor([3, 0, 2])
                fused.keep(keep), ops.keep(keep)
                tok = tok[keep]
            a, b = fused.step(tok), ops.step(tok)
            worst = max(worst, float((a - b).abs().max() / b.abs().max()))
            assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert worst < 1e-5, worst
    t = ids.shape[1] + 40
    keys = fused._k[..., :t].transpose(-1, -2)
    assert torch.allclose(keys, ops._k[:, :, :, :t], atol=1e-5, rtol=1e-5)
    assert torch.allclose(fused._v[:, :, :, :t], ops._v[:, :, :, :t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 16, 25, 32])
def test_the_float32_small_row_matmul_equals_f_linear(rows):
    """The float32 `small_linear` (a decode step of at most 32 rows over weight panels; row
    tiles of 12, 8, 4, 2, 1 with AVX512 and 6, 4, 2, 1 without) against `F.linear`: float32
    summation order only, with and without a bias, for one panel and for many."""
    kern = dk.load(dtype=torch.float32)
    assert kern is not None and kern.small_rows == 32 and kern.panel_rows in (16, 32)
    g = torch.Generator().manual_seed(rows)
    for n, k in ((960, 576), (kern.panel_rows, 7)):
        x, w, b = (torch.randn(s, generator=g) for s in ((rows, 1, k), (n, k), (n,)))
        packed = kern.small_weight(w)
        assert packed is not None and packed.shape == w.shape and not torch.equal(packed, w)
        for bias in (None, b):
            want = torch.nn.functional.linear(x, w, bias)
            torch.testing.assert_close(kern.small_linear(x, packed, bias), want, atol=1e-4,
                                       rtol=1e-5)
    with pytest.raises(ValueError, match="33 rows"):
        kern.small_linear(torch.zeros((33, 1, 7)), packed, None)
    with pytest.raises(ValueError, match="w must be a contiguous torch.float32"):
        kern.small_linear(x, packed.t().contiguous().t(), None)


def test_the_float32_small_weight_declines_what_is_not_whole_panels():
    kern = dk.load(dtype=torch.float32)
    assert kern.small_weight(torch.zeros((kern.panel_rows + 8, 64))) is None
    assert kern.small_weight(torch.zeros((kern.panel_rows, 64), dtype=torch.bfloat16)) is None
    assert kern.small_weight(torch.zeros((64, kern.panel_rows)).t()) is None  # not contiguous


def small_linear_rows(monkeypatch, dec: StaticDecoder) -> list[int]:
    """The row count of every `small_linear` call `dec` makes from now on (appended)."""
    calls: list[int] = []
    orig = dec._small.small_linear
    monkeypatch.setattr(dec._small, "small_linear",
                        lambda x, w, b: calls.append(x.shape[0]) or orig(x, w, b))
    return calls


def test_a_float32_decoder_takes_the_small_row_matmul_up_to_32_rows(monkeypatch):
    """Up to 32 rows every matmul of a step whose weight is whole panels goes through
    `small_linear` (33 rows none), and the logits stay within float32 summation order of the
    torch-op decoder's."""
    model = model_with("llama", 4, 2, 64)
    dec = StaticDecoder(model, kernels="c")
    ops = StaticDecoder(model)
    calls = small_linear_rows(monkeypatch, dec)
    panels = [dec._small.small_weight(w) is not None
              for b in dec.blocks for w in (b.wqkv, b.wo, b.wgu, b.wd)]
    assert all(panels)  # this model's block weights are whole panels
    head = dec._small.small_weight(dec.head) is not None
    with torch.no_grad():
        for rows in (33, 32):
            ids, pad = left_pad([[5 + r % 200, 6, 7 + r % 50] for r in range(rows)])
            dec.start(ids, pad, 6), ops.start(ids, pad, 6)
            tok = torch.arange(rows) % 250
            a, b = dec.step(tok), ops.step(tok)
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    # 32 rows: the prefill's head (if whole panels), the step's 4 matmuls in each of 2
    # blocks, its head
    assert calls == [32] * (int(head) + 4 * 2 + int(head))


def avx512_bf16() -> bool:
    """Whether this CPU has AVX512-BF16 dot products (the bfloat16 `small_linear`)."""
    try:
        return " avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_the_bfloat16_library_has_a_small_row_matmul_exactly_where_the_cpu_has_bf16_dots():
    assert dk.load(dtype=torch.bfloat16).small_rows == (32 if avx512_bf16() else 0)


BF16_SMALL = pytest.mark.skipif(not dk.load(dtype=torch.bfloat16).small_rows,
                                reason="this CPU has no AVX512-BF16 dot products")


@BF16_SMALL
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 11, 12, 13, 16, 25, 32])
def test_the_bfloat16_small_row_matmul_is_the_float32_sum_rounded_once(rows):
    """The bfloat16 `small_linear` (its row tiles 12, 8, 4, 1 over pairs of 16-column
    blocks, an odd block count's last block alone) against the float32 product of the same
    bfloat16 inputs plus bias, rounded once: within one bfloat16 rounding (2^-8 relative, the
    float32 sums differing in order only), with and without a bias."""
    kern = dk.load(dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(rows)
    for n, k in ((960, 576), (48, 64)):  # 60 blocks; 3 blocks (the odd one alone)
        x, w, b = (torch.randn(s, generator=g).bfloat16() for s in ((rows, 1, k), (n, k), (n,)))
        packed = kern.small_weight(w)
        assert packed is not None and packed.shape == w.shape
        for bias in (None, b):
            exact = torch.nn.functional.linear(x.float(), w.float(),
                                               None if bias is None else bias.float())
            got = kern.small_linear(x, packed, bias)
            assert got.dtype == torch.bfloat16 and got.shape == (rows, 1, n)
            torch.testing.assert_close(got.float(), exact, rtol=2 ** -8, atol=1e-3)
            assert float((got.float() - exact.bfloat16().float()).abs().gt(0).float().mean()) \
                < 0.05  # nearly all outputs are the exact sum's own rounding


def test_small_weight_declines_what_the_bfloat16_matmul_cannot_take():
    kern = dk.load(dtype=torch.bfloat16)
    w = torch.zeros((40, 64), dtype=torch.bfloat16)  # 40 rows: not whole 16-row blocks
    assert kern.small_weight(w) is None
    assert kern.small_weight(torch.zeros((48, 63), dtype=torch.bfloat16)) is None  # odd K
    assert kern.small_weight(torch.zeros((48, 64))) is None  # float32 into bfloat16's
    if kern.small_rows:
        packed = kern.small_weight(torch.zeros((48, 64), dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="33 rows"):
            kern.small_linear(torch.zeros((33, 1, 64), dtype=torch.bfloat16), packed, None)
        with pytest.raises(ValueError, match="do not match"):
            kern.small_linear(torch.zeros((2, 1, 32), dtype=torch.bfloat16), packed, None)


@BF16_SMALL
def test_a_bfloat16_decoder_takes_the_small_row_matmul_up_to_32_rows(monkeypatch):
    """Up to 32 rows every block matmul of a step goes through `small_linear` (the head, 260
    columns, is not whole 16-column blocks and keeps oneDNN's), 33 rows none; the logits
    stay within bfloat16 rounding of the torch-op decoder's."""
    model = model_with("llama", 4, 2, 64, seed=5)
    dec = StaticDecoder(model, dtype=torch.bfloat16, kernels="c")
    ops = StaticDecoder(model, dtype=torch.bfloat16)
    calls = small_linear_rows(monkeypatch, dec)
    with torch.no_grad():
        for rows in (33, 32):
            ids, pad = left_pad([[5 + r % 200, 6, 7 + r % 50] for r in range(rows)])
            dec.start(ids, pad, 6), ops.start(ids, pad, 6)
            tok = torch.arange(rows) % 250
            a, b = dec.step(tok), ops.step(tok)
            assert float(kl(b, a).max()) < 1e-3
    assert calls == [32] * (4 * 2)


def test_a_shared_prefix_and_capacity_changes_keep_the_fused_steps_right():
    """Prompts sharing a prefix (prefilled once), then a second call with another row count
    and capacity (the work buffers are rebuilt): top-1 equal to the torch-op decoder's."""
    model = model_with("llama", 4, 2, 64, seed=2)
    shared = list(range(20, 60))
    calls = [[shared + [1, 2], shared + [3], shared + [4, 5, 6]], [[7, 8, 9], [10, 11]]]
    fused = StaticDecoder(model, dtype=torch.bfloat16, kernels="c")
    ops = StaticDecoder(model, dtype=torch.bfloat16)
    with torch.no_grad():
        for rows, extra in zip(calls, (12, 30), strict=True):
            ids, pad = left_pad(rows)
            a, b = fused.start(ids, pad, ids.shape[1] + extra), ops.start(ids, pad,
                                                                        ids.shape[1] + extra)
            for _ in range(extra - 1):
                tok = b.argmax(-1)
                a, b = fused.step(tok), ops.step(tok)
                assert float(kl(b, a).max()) < 1e-3
    assert list(fused._fused._bufs) == [(2, 3 + 30)]


def test_a_cache_in_another_layout_is_refused_before_the_kernels_read_it():
    model = model_with("llama", 4, 2, 64)
    dec = StaticDecoder(model, dtype=torch.bfloat16, kernels="c")
    ids, pad = left_pad([[5, 6, 7], [8, 9]])
    with torch.no_grad():
        dec.start(ids, pad, 8)
        dec._v = dec._v.transpose(3, 4).contiguous().transpose(3, 4)  # same shape, strided
        with pytest.raises(ValueError, match="decode_kernels: values must be a contiguous"):
            dec.step(torch.tensor([1, 2]))



def test_a_library_of_the_other_storage_type_is_refused_before_it_reads():
    model = model_with("llama", 4, 2, 64)
    dec = StaticDecoder(model, dtype=torch.float32, kernels="c")
    dec._fused.kern = dk.load(dtype=torch.bfloat16)  # the bfloat16 library
    ids, pad = left_pad([[5, 6, 7], [8, 9]])
    with torch.no_grad():
        dec.start(ids, pad, 8)
        with pytest.raises(ValueError, match="the torch.bfloat16 library cannot run a "
                                             "torch.float32 decoder"):
            dec.step(torch.tensor([1, 2]))


def test_engine_uses_the_kernels_for_bfloat16_and_keeps_sampling_valid():
    """The engine's default (`decode_kernels: auto`) takes the kernels for a bfloat16 or
    float32 static decoder on CPU: seeded sampling reproducible, templated output valid;
    `torch` keeps torch ops."""
    from tests.engines.generation.test_static_decoder import tiny

    class Tok:
        pad_token_id, eos_token_id = 259, 258

        def encode(self, text, add_special_tokens=False):
            return [ord(ch) % 256 for ch in text]

        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids if i < 256)

    model = tiny("qwen2", seed=3)
    engine = HFGenerationEngine(model, Tok(), decode_dtype="bfloat16")
    assert engine.decode_kernels == "c" and engine._decoder._fused is not None
    assert HFGenerationEngine(model, Tok()).decode_kernels == "c"  # float32
    assert HFGenerationEngine(model, Tok(), decode_kernels="torch").decode_kernels == "torch"
    assert HFGenerationEngine(model, Tok(), decode_dtype="bfloat16",
                              decode_kernels="torch").decode_kernels == "torch"
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]
    templ = SamplingParams(max_new_tokens=40, temperature=0.9, seed=1,
                           template=(Segment("```", "\n", 10), Segment("```", "", 8)))
    s1 = engine.generate(prompts, templ)
    s2 = HFGenerationEngine(model, Tok(), decode_dtype="bfloat16").generate(prompts, templ)
    assert [g.completion_ids for g in s1] == [g.completion_ids for g in s2]
    assert all(g.finish_reason == "stop" and g.text.count("```") == 2 for g in s1)


def test_the_kernels_exp_is_within_one_ulp_and_keeps_the_edges():
    """The vectorisable exp of the softmax and SiLU: within 1 ulp of float64's e^x over the
    float32 range of normal results; 0 below it (so a -inf mask gives weight 0), +inf above,
    NaN kept."""
    kern = dk.load()
    x = torch.linspace(-87.3, 88.72, 400_001)
    got = kern.exp(x).double()
    want = torch.exp(x.double())
    ulp = torch.nextafter(want.float(), torch.tensor(float("inf"))).double() - want.float()
    assert float(((got - want).abs() / ulp).max()) <= 1.0
    edges = kern.exp(torch.tensor([float("-inf"), -100.0, 89.0, float("inf"), 0.0,
                                   float("nan")]))
    assert edges[:5].tolist() == [0.0, 0.0, float("inf"), float("inf"), 1.0]
    assert edges[5].isnan()


def test_the_library_is_built_once_and_kept_under_its_key(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    first = dk.build(tmp_path)
    stamp = first.stat().st_mtime_ns
    assert "compiled the bf16 decode kernels" in caplog.text
    caplog.clear()
    assert dk.build(tmp_path) == first and first.stat().st_mtime_ns == stamp
    assert "compiled" not in caplog.text
    assert [p.name for p in (tmp_path / "decode_kernels").iterdir()] == [first.name]
    other = dk.build(tmp_path, torch.float32)  # the float32 variant: its own file
    assert "compiled the f32 decode kernels" in caplog.text
    assert first.name.startswith("decode_kernels-bf16-")
    assert other.name.startswith("decode_kernels-f32-")
    assert sorted(p.name for p in (tmp_path / "decode_kernels").iterdir()) == sorted(
        [first.name, other.name])


def test_another_source_gets_another_key(tmp_path, monkeypatch):
    compiler = dk._compiler()
    assert compiler is not None
    before = dk.build_key(compiler)
    src = tmp_path / "decode_kernels.c"
    src.write_text(dk.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(dk, "SOURCE", src)
    assert dk.build_key(compiler) != before


def test_a_source_that_does_not_compile_names_the_compilers_error(tmp_path, monkeypatch):
    src = tmp_path / "decode_kernels.c"
    src.write_text("int broken( {\n")
    monkeypatch.setattr(dk, "SOURCE", src)
    with pytest.raises(RuntimeError, match="failed on decode_kernels.c"):
        dk.build(tmp_path / "cache")
    assert not any((tmp_path / "cache" / "decode_kernels").iterdir())  # no partial file


def test_without_a_compiler_auto_falls_back_and_c_is_an_error(tmp_path, monkeypatch, caplog):
    from tests.engines.generation.test_static_decoder import tiny

    monkeypatch.setenv("COMPASSPLAY_CACHE", str(tmp_path))  # nothing built there
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(dk, "_loaded", {})
    caplog.set_level(logging.WARNING)
    model = tiny("llama")
    assert StaticDecoder(model, dtype=torch.bfloat16, kernels="auto").kernels == "torch"
    assert "no C compiler" in caplog.text and caplog.text.count("unavailable") == 1
    with pytest.raises(ValueError, match="decode_kernels=c: the library could not be built"):
        StaticDecoder(model, dtype=torch.bfloat16, kernels="c")
    with pytest.raises(ValueError, match="decode_kernels=c: the decoder runs in torch.float64"):
        StaticDecoder(model, dtype=torch.float64, kernels="c")
    with pytest.raises(ValueError, match="unknown choice 'fast'"):
        StaticDecoder(model, kernels="fast")


def test_the_kernels_share_torchs_openmp_runtime():
    """The library's libgomp.so.1 is torch's (the system's, which a plain load of the
    library would bring, is not mapped): the kernels' parallel loops use torch's thread pool
    and thread count instead of starting a second pool on the same cores. (Wheels that vendor
    a renamed libgomp, e.g. sentencepiece's, keep their own pool under their own name.)"""
    ours = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if not ours.exists():
        pytest.skip("this torch build does not ship libgomp.so.1")
    assert dk.load() is not None
    maps = Path("/proc/self/maps").read_text().splitlines()
    gomp = {line.split()[-1] for line in maps if line.endswith("/libgomp.so.1")}
    assert gomp == {str(ours)}, gomp
    assert any("decode_kernels-" in line for line in maps)
