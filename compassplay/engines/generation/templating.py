"""Constrained decoding of a reply's structure (`SamplingParams.template`), one reply at a time.

A `TemplateCursor` follows one completion through its `Segment`s: while a segment is free the
engine samples (end-of-sequence masked); once the segment's stop string has appeared in the
text sampled since the segment began (or its token cap is hit, which forces the stop string),
the tokens of the segment's forced text are queued (after one of the segment's `ends`, or at
its cap: a newline unless the text ends with one, the stop string, then the forced text) and
emitted one per step, and after the last segment the end-of-sequence token. A free part is
never empty: its first token may not be the first token of its stop string or of one of its
ends. The engine asks `forced()` before sampling and calls `advance()` after each token. Pure
Python over token ids; no model, no torch. (The vLLM engine constrains a reply by the same
template's regular expression instead: `template_regex`.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compassplay.engines.generation.base import Segment


class TemplateCursor:
    """Where one completion is in its template.

    encode: text -> token ids (no special tokens); decode: token ids -> text; eos_id: the
    token forced after the last segment (None: none, the completion just ends).
    """

    def __init__(self, template: Sequence[Segment], encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str], eos_id: int | None) -> None:
        if not template:
            raise ValueError("a TemplateCursor needs at least one Segment")
        self.template, self.encode, self.decode, self.eos_id = list(template), encode, decode, \
            eos_id
        self.segment = 0          # index of the current (or, while forcing, the next) segment
        self.segment_start = 0    # index in the completion where the free part began
        self.sampled = 0          # tokens sampled in the current segment
        self.queue: list[int] = []
        self.finished = False     # every segment and the final forced tokens are out

    def banned(self) -> list[int]:
        """Tokens the next step may not sample: at the start of a free segment, the first
        token of its stop string and of each of its `ends` (no empty block)."""
        if not self.free or self.sampled:
            return []
        seg = self.template[self.segment]
        return sorted({ids[0] for s in (seg.stop, *seg.ends) if (ids := self.encode(s))})

    def forced(self) -> int | None:
        """The token the next step must emit, or None when the step samples freely."""
        return self.queue[0] if self.queue else None

    @property
    def free(self) -> bool:
        return not self.queue and not self.finished

    def advance(self, completion: list[int]) -> None:
        """Account for the token just appended to `completion` (forced or sampled)."""
        if self.finished:
            return
        if self.queue:
            self.queue.pop(0)
            if not self.queue:
                self._after_forced(len(completion))
            return
        self.sampled += 1
        seg = self.template[self.segment]
        text = self.decode(completion[self.segment_start:])
        if seg.stop in text:
            self._close(seg.then, len(completion))
        elif any(e in text for e in seg.ends):
            self._close(("" if text.endswith("\n") else "\n") + seg.stop + seg.then,
                        len(completion))
        elif self.sampled >= seg.max_tokens:  # the stop on a line of its own (a fence)
            self._close(("" if text.endswith("\n") else "\n") + seg.stop + seg.then,
                        len(completion))

    def _close(self, text: str, length: int) -> None:
        ids = self.encode(text) if text else []
        self.segment += 1
        if self.segment >= len(self.template) and self.eos_id is not None:
            ids.append(self.eos_id)
        self.queue = ids
        self.sampled = 0
        if not ids:  # nothing to force: the next segment (or the end) starts here
            self._after_forced(length)

    def _after_forced(self, length: int) -> None:
        if self.segment >= len(self.template):
            self.finished = True
        else:
            self.segment_start = length
