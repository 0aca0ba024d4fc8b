"""Which rows of a left-padded prefill share a leading token run worth computing once.

A batched prefill computes B x T columns (B rows left-padded to width T). When rows share a
prompt prefix (n samples of one task type share its instruction text), `StaticDecoder.start`
can instead prefill each shared prefix once (one row, unpadded), copy its keys and values into
every member row's cache columns (row i's prompt starts at column pad_i, position = column -
pad_i, so a prefix's rotary keys are the same in every row) and then run one batched pass over
columns c0..T-1 for all rows. `plan_prefix` picks the groups and c0 by a column count: a pass
over P columns of one row costs P + `PASS_COLUMNS`, the batched pass B (T - c0).

Groups are runs of rows in lexicographic order whose adjacent common prefixes are all >= a
threshold tau; every candidate tau (the adjacent common prefixes >= `MIN_SHARED`) is costed
and the cheapest plan kept. A row alone in its group may still be prefilled by itself up to
column c0 (it then pays no left padding before c0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_SHARED = 32     # tokens: a shorter common prefix is not worth a group
PASS_COLUMNS = 16   # a separate prefill pass's fixed cost, in prefill columns (calls, head)


@dataclass(frozen=True)
class PrefixPass:
    """One row-alone prefill: `source`'s first `length` prompt tokens (positions 0..length-1),
    whose keys/values are copied to each member's columns pad_m..pad_m + n_m - 1."""

    source: int
    length: int
    members: tuple[tuple[int, int], ...]  # (row, n_m tokens copied), source included


@dataclass(frozen=True)
class PrefixPlan:
    """`passes` fill every row's columns before `start` (c0); the batched pass computes
    columns start..T-1 of every row. `cost`: prefill columns (see the module doc)."""

    start: int
    passes: tuple[PrefixPass, ...]
    cost: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common leading run of a and b."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def sorted_with_lcp(prompts: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """(order, lcp): the row indices in the lexicographic order of `prompts` (rows with a
    common prefix are adjacent) and lcp[k], the common prefix of rows order[k], order[k+1]."""
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    return order, [common_prefix(prompts[a], prompts[b])
                   for a, b in zip(order, order[1:], strict=False)]


def _groups(order: list[int], lcp: list[int], tau: int, lengths: list[int]
            ) -> list[tuple[list[int], int]]:
    """Split rows `order` (sorted) where the adjacent common prefix lcp[k] < tau. Each group:
    (rows, shared tokens); a group of one shares its whole prompt."""
    groups: list[tuple[list[int], int]] = []
    rows, shared = [order[0]], lengths[order[0]]
    for k, nxt in enumerate(order[1:]):
        if lcp[k] >= tau:
            rows.append(nxt)
            shared = min(shared, lcp[k]) if len(rows) > 2 else lcp[k]
        else:
            groups.append((rows, shared))
            rows, shared = [nxt], lengths[nxt]
    groups.append((rows, shared))
    return groups


def _plan(groups: list[tuple[list[int], int]], pads: list[int], width: int,
          pass_columns: int) -> PrefixPlan:
    """The plan (and its cost) for these groups: c0 as late as every group's shared run
    allows (at most T - 1: the batched pass computes the last column's logits)."""
    c0 = min([width - 1] + [min(pads[r] for r in rows) + shared for rows, shared in groups])
    passes, cost = [], len(pads) * (width - c0) + pass_columns
    for rows, _ in groups:
        src = min(rows, key=lambda r: pads[r])
        length = c0 - pads[src]
        if length <= 0:
            continue
        members = tuple((r, c0 - pads[r]) for r in rows if c0 > pads[r])
        passes.append(PrefixPass(src, length, members))
        cost += length + pass_columns
    return PrefixPlan(c0, tuple(passes), cost)


def plan_prefix(prompts: list[list[int]], width: int, min_shared: int = MIN_SHARED,
                pass_columns: int = PASS_COLUMNS) -> PrefixPlan | None:
    """The cheapest shared-prefix plan for distinct, non-empty `prompts` left-padded to
    `width`, or None when no two rows share `min_shared` tokens or no plan costs fewer
    columns than the plain prefill (B T + `pass_columns`)."""
    n = len(prompts)
    if n < 2:
        return None
    lengths = [len(p) for p in prompts]
    pads = [width - m for m in lengths]
    order, lcp = sorted_with_lcp(prompts)
    best: PrefixPlan | None = None
    for tau in sorted({x for x in lcp if x >= min_shared}):
        plan = _plan(_groups(order, lcp, tau, lengths), pads, width, pass_columns)
        if best is None or plan.cost < best.cost:
            best = plan
    if best is None or best.cost >= n * width + pass_columns:
        return None
    return best
