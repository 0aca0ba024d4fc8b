"""Shared-prefix prefill: the plan (which rows share what), and the static decoder's logits
and KV cache after it against its plain prefill's (float32: equal to float rounding, 1e-7;
bfloat16: the matmuls of other shapes round differently, logits and cached keys/values within
0.004 of the plain prefill's on these tiny models, asserted to 0.03, the same argmax)."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines.generation import static_decoder as sd
from compassplay.engines.generation.prefix_plan import PrefixPass, PrefixPlan, plan_prefix
from compassplay.engines.generation.static_decoder import StaticDecoder
from tests.engines.generation.test_static_decoder import left_pad, oracle_logits, tiny


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 258, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _rows() -> list[list[int]]:
    """Two groups (40 and 36 shared tokens, members of different lengths, so different pad
    counts), a group of one, a short unrelated row and repeated rows."""
    a, b = _tokens(40, 1), _tokens(36, 2)
    return [a + _tokens(5, 3), b + _tokens(20, 4), a + _tokens(2, 5), a[:12] + _tokens(9, 6),
            a + _tokens(5, 3), b + _tokens(3, 7), [7, 8], a + _tokens(11, 8),
            b + _tokens(20, 4)]


def test_plan_groups_shared_prefixes_and_falls_back_without_them():
    rows = _rows()[:4] + _rows()[5:8]  # distinct rows
    width = max(map(len, rows))
    plan = plan_prefix(rows, width)
    assert plan is not None and plan.cost < len(rows) * width
    shared = {frozenset(r for r, _ in p.members) for p in plan.passes}
    assert frozenset({0, 2, 6}) in shared and frozenset({1, 4}) in shared
    for p in plan.passes:  # every copied run lies in the shared part of its source's prompt
        for row, n in p.members:
            assert rows[row][:n] == rows[p.source][:n] and width - len(rows[row]) + n == \
                plan.start
    distinct = [_tokens(64, s) for s in range(16)]  # the benchmark's shape: nothing shared
    assert plan_prefix(distinct, 64) is None
    assert plan_prefix([_tokens(20, 1) + [3], _tokens(20, 1) + [4]], 21) is None  # too short
    assert plan_prefix([_tokens(50, 1)], 50) is None


def _valid_cache(dec: StaticDecoder, pad: torch.Tensor, width: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each row's cached keys [L, nkv, d, n] (or [L, nkv, n, d]) and values at its prompt's
    columns pad..width-1."""
    out = []
    for row, p in enumerate(pad.tolist()):
        out.append((dec._key_cols(dec._k, row, p, width).float(),
                    dec._v[:, row, :, p:width].float()))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_prefix_prefill_equals_the_plain_prefill(arch, dtype, monkeypatch):
    model = tiny(arch, seed=4)
    rows = _rows()
    ids, pad = left_pad(rows)
    width = ids.shape[1]
    shared, plain = StaticDecoder(model, dtype=dtype), StaticDecoder(model, dtype=dtype)
    plain.share_prefixes = False
    calls = []
    orig = StaticDecoder._prefill_shared
    monkeypatch.setattr(StaticDecoder, "_prefill_shared",
                        lambda self, *a: calls.append(a[2]) or orig(self, *a))
    tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else \
        {"atol": 3e-2, "rtol": 0.0}  # bfloat16 matmuls of other shapes round differently
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        a, b = shared.start(ids, pad, width + 4), plain.start(ids, pad, width + 4)
        assert len(calls) == 1 and calls[0].start > 0  # the shared path ran
        plan, distinct = calls[0], len({tuple(r) for r in rows})  # columns computed (bench)
        assert shared.prefill_columns == distinct * (width - plan.start) + sum(
            p.length for p in plan.passes) < plain.prefill_columns == distinct * width
        torch.testing.assert_close(a, b, **tol)
        if dtype == torch.float32:
            torch.testing.assert_close(a, oracle_logits(model, rows), atol=1e-4, rtol=1e-4)
        for (ka, va), (kb, vb) in zip(_valid_cache(shared, pad, width),
                                      _valid_cache(plain, pad, width), strict=True):
            torch.testing.assert_close(ka, kb, **tol)
            torch.testing.assert_close(va, vb, **tol)
        for _ in range(4):
            tok = torch.randint(0, 258, (len(rows),), generator=g)
            torch.testing.assert_close(shared.step(tok), plain.step(tok), **tol)


def test_prefill_of_later_columns_matches_one_pass(monkeypatch):
    """`_forward` from t0 > 0 (a chunked prefill against the cache): row 0's first 10 columns
    from a row-alone pass, then columns 10.. of both rows (row 1 still padding at the chunk's
    first columns) give the module forward's logits."""
    model = tiny("llama", seed=2)
    rows = [_tokens(30, 9), _tokens(12, 10)]
    ids, pad = left_pad(rows)
    plan = PrefixPlan(10, (PrefixPass(0, 10, ((0, 10),)),), 0)
    monkeypatch.setattr(sd, "plan_prefix", lambda *a: plan)
    with torch.no_grad():
        logits = StaticDecoder(model).start(ids, pad, 40)
    torch.testing.assert_close(logits, oracle_logits(model, rows), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_differing_only_in_their_last_token(dtype):
    """The batched pass is then one column (c0 = T - 1, the decode step's form), also when a
    row's prompt is a prefix of another's (two columns for the third rows; the fourth's short
    row is prefilled alone for one column)."""
    model = tiny("qwen2", seed=6)
    a = _tokens(40, 11)
    for rows, start in (([a + [1], a + [2], a + [3]], 40), ([a, a + [5]], 40),
                        ([a + [1], a[:39] + [2]], 39), ([a + [1], a + [2], [9, 8]], 40)):
        ids, pad = left_pad(rows)
        assert plan_prefix(rows, ids.shape[1]).start == start
        shared, plain = StaticDecoder(model, dtype=dtype), StaticDecoder(model, dtype=dtype)
        plain.share_prefixes = False
        tol = {"atol": 2e-5, "rtol": 1e-5} if dtype == torch.float32 else \
            {"atol": 3e-2, "rtol": 0.0}
        with torch.no_grad():
            torch.testing.assert_close(shared.start(ids, pad, 48), plain.start(ids, pad, 48),
                                       **tol)
            tok = torch.tensor([7] * len(rows))
            torch.testing.assert_close(shared.step(tok), plain.step(tok), **tol)
