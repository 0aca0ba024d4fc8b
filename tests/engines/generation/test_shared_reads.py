"""Decode steps that read shared cached columns from one row (`shared_reads`): the table
after a prefill and after `keep`, and the fused steps it drives against the same steps
reading every row's own copy (bit for bit), with proof that the shared columns are read from
the source row."""

from __future__ import annotations

import pytest
import torch

from compassplay.engines.generation import decode_kernels as dk
from compassplay.engines.generation.prefix_plan import PrefixPass, PrefixPlan
from compassplay.engines.generation.shared_reads import (
    own_reads,
    reads_after_keep,
    reads_after_start,
)
from compassplay.engines.generation.static_decoder import StaticDecoder
from tests.engines.generation.test_decode_kernels import left_pad, model_with


def test_repeated_prompts_read_their_first_rows_prompt_columns():
    # rows 0 and 2 are one prompt (pad 1), rows 1 and 3 another (pad 0); width 5
    got = reads_after_start([1, 0, 1, 0], 5, [0, 1, 0, 1], None).tolist()
    assert got == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 5, 0], [0, 1, 0, 5, 0]]


def test_a_prefix_member_reads_the_prefix_from_its_passs_source_at_its_offset():
    # distinct prompts 0 (pad 2) and 1 (pad 0) share a prefix computed from prompt 1 up to
    # column c0 = 6: prompt 0 copied 4 columns (2..5), which are prompt 1's columns 0..3
    plan = PrefixPlan(6, (PrefixPass(1, 6, ((1, 6), (0, 4))),), 0)
    got = reads_after_start([2, 0, 2], 9, [0, 1, 0], plan).tolist()
    assert got == [[2, 1, 2, 6, -2],   # prompt 0's first row: the prefix from row 1
                   [0, 1, 0, 0, 0],    # the pass's source reads its own
                   [2, 0, 2, 9, 0]]    # prompt 0's second row: all of row 0's prompt


def test_keep_reindexes_kept_sources_and_falls_back_to_the_own_copy():
    reads = torch.tensor([[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [1, 0, 1, 5, 0], [0, 1, 0, 5, 0]])
    got = reads_after_keep(reads, [3, 2, 0]).tolist()
    # row 3's source (1) was dropped: its own copy; row 2's source (0) is now row 2
    assert got == [[0, 0, 0, 0, 0], [1, 2, 1, 5, 0], [1, 2, 0, 0, 0]]


def prompts() -> list[list[int]]:
    """Six rows: two samples each of two prompts sharing a 40-token prefix (a prefix plan)
    and two samples of a short prompt of its own."""
    shared = list(range(20, 60))
    a, b, c = shared + [1, 2], shared + [3, 4, 5, 6], [7, 8, 9]
    return [a, b, c, a, b, c]


@pytest.mark.skipif(dk.load() is None, reason="no C compiler builds the kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_reads_give_the_own_reads_steps_bit_for_bit_and_read_the_source(dtype):
    """Fused steps with the table `start` builds against the same decoder whose table says
    every row reads its own cache: equal logits at every step, through a `keep` that drops a
    source row. Then the copies that shared reads skip are overwritten with garbage: the
    shared-read step still equals the untouched own-read one, an own-read step on the
    overwritten cache does not."""
    model = model_with("llama", 4, 2, 64, seed=3)
    ids, pad = left_pad(prompts())
    shared, ref, own = (StaticDecoder(model, dtype=dtype, kernels="c") for _ in range(3))
    with torch.no_grad():
        logits = [d.start(ids, pad, ids.shape[1] + 12) for d in (shared, ref, own)]
        # prompt b (no pad) is the prefix pass's source: rows 0 (a, its prefix), 3 (a), 4 (b)
        # and 5 (c) read from rows 1, 0, 1 and 2
        assert [r[1] for r in shared._reads.tolist()] == [1, 1, 2, 0, 1, 2]
        for d in (ref, own):
            d._reads = torch.tensor(own_reads(pad.tolist()))
        for step in range(8):
            if step == 4:  # drop row 0, the source of row 3
                keep = torch.tensor([5, 1, 3, 4, 2])
                for d in (shared, ref, own):
                    d.keep(keep)
                logits = [x[keep] for x in logits]
                assert [r[1] for r in shared._reads.tolist()] == [4, 1, 2, 1, 4]
            tok = logits[1].argmax(-1)
            logits = [d.step(tok) for d in (shared, ref, own)]
            assert torch.equal(logits[0], logits[1]) and torch.equal(logits[2], logits[1])
        overwritten = 0
        for row, (_, src, lo, hi, _) in enumerate(shared._reads.tolist()):
            if src != row and hi > lo:
                for d in (shared, own):
                    d._v[:, row, :, lo:hi] = 100.0
                overwritten += 1
        assert overwritten == 2
        tok = logits[1].argmax(-1)
        a, b, c = (d.step(tok) for d in (shared, ref, own))
        assert torch.equal(a, b)
        assert not torch.allclose(c, b, atol=1e-2)
