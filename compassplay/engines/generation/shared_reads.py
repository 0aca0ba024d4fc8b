"""Which cached columns a decode step reads from another row (`cp_rope_attend`'s `reads`).

After `StaticDecoder.start`, rows that are samples of one prompt hold the same keys and values
in every prompt column (the prompt is prefilled once and its cache copied), and rows whose
prompts share a prefix (`prefix_plan`) hold the same ones in the prefix's columns (at another
column offset where their left padding differs). A decode step that reads those columns from
one source row instead of from each row's own copy streams them from memory once per source
(the rows of a KV head run one after another, so the copies they skip would have been read
from memory while the source's are still in cache), and gets the same numbers bit for bit.

The table is [B, 5] int64, per row (`READS` names the fields): `first`, its first column that
is not a pad (pad columns are masked: never read); `src`, `lo`, `hi`, `off`: columns lo..hi-1
are read as row src's columns lo + off..hi - 1 + off. A row reading only its own cache has
src = itself and lo = hi = 0.
"""

from __future__ import annotations

import torch

from compassplay.engines.generation.prefix_plan import PrefixPlan

READS = ("first", "src", "lo", "hi", "off")


def own_reads(pad: list[int]) -> list[list[int]]:
    """Every row reading its own cache from its first column that is not a pad."""
    return [[p, b, 0, 0, 0] for b, p in enumerate(pad)]


def reads_after_start(pad: list[int], width: int, inverse: list[int] | None,
                      plan: PrefixPlan | None) -> torch.Tensor:
    """The table after a prefill of B rows left-padded to `width` (pad: [B] pad counts).
    inverse[b]: row b's index among the distinct prompts (None: all distinct); `plan`: the
    distinct prompts' shared-prefix plan (None: none). A repeated prompt's rows read its
    first row's prompt columns; a distinct prompt's first row that copied a prefix from
    another prompt's pass reads that prefix from the pass's source row."""
    rows = own_reads(pad)
    uniq = list(range(len(pad))) if inverse is None else inverse
    first_row: dict[int, int] = {}
    for b, u in enumerate(uniq):
        first_row.setdefault(u, b)
    upad = {u: pad[b] for u, b in first_row.items()}
    prefix: dict[int, tuple[int, int]] = {}  # distinct prompt -> (source prompt, columns)
    for p in plan.passes if plan is not None else ():
        for member, n in p.members:
            if member != p.source:
                prefix[member] = (p.source, n)
    for b, u in enumerate(uniq):
        if first_row[u] != b:
            rows[b] = [pad[b], first_row[u], pad[b], width, 0]
        elif u in prefix:
            source, n = prefix[u]
            rows[b] = [pad[b], first_row[source], pad[b], pad[b] + n, upad[source] - pad[b]]
    return torch.tensor(rows, dtype=torch.long).reshape(len(pad), len(READS))


def reads_after_keep(reads: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The table for the kept rows `rows` (old indices, in their new order): a row whose
    source was kept reads from its new index, one whose source was dropped reads its own
    cache (it holds the same columns)."""
    new_index = {old: new for new, old in enumerate(rows)}
    table, out = reads.tolist(), []
    for new, old in enumerate(rows):
        first, src, lo, hi, off = table[old]
        if src == old or src not in new_index:
            out.append([first, new, 0, 0, 0])
        else:
            out.append([first, new_index[src], lo, hi, off])
    return torch.tensor(out, dtype=torch.long).reshape(len(rows), len(READS))
