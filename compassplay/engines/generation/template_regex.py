"""A regular expression for the replies a template admits (for engines with regex-constrained
decoding, e.g. vLLM's structured outputs); the HF engine follows the template with a
`TemplateCursor` instead.

Per `Segment`, over characters, as the cursor sees the text (one character per token):

* a free part that is non-empty (its first character is not the first character of the stop
  string or of an end), in which neither the stop string nor any end occurs before its last
  character;
* closed by the stop string (the free part's last characters), then the forced `then`; or by an
  end, after which the stop string is forced on a line of its own (a newline first unless the end
  ends with one), then `then`.

The reply ends after the last segment (the regex is anchored by `re.fullmatch` / the
engine's grammar, which then only admits end-of-sequence).

Token caps (`Segment.max_tokens`) are not counted: a regex sees characters, not tokens, and a
bounded repetition of the free part would multiply the grammar's size. The text a cursor forces
at a cap (the free part, a newline unless it ends with one, the stop string, `then`) is itself a
free part closed by its stop or an end whenever the stop and ends are fences and newlines, as
in the code environment's templates, so it matches. An engine that decodes by this regex
bounds a reply by the request's token limit (`SamplingParams.max_new_tokens`, which
`from_section` sets to the segments' caps plus forced text): a reply that reaches it is cut,
with finish_reason "length".

The free part's language is built from the automaton that tracks the longest suffix of the
text that is a proper prefix of the stop or an end (the states), turned into a regex by state
elimination. The syntax is the common subset of Python's `re` and ECMAScript regexes (what
xgrammar reads): groups `(...)`, `|`, `*`, `?`, classes `[...]`, `[^...]`, escapes `\\n`, `\\t`,
`\\r`, `\\xHH`, no `(?:` and no `{m,n}`. Pure Python; no engine import.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from compassplay.engines.generation.base import Segment

OTHER = ""  # the transition label for any character that occurs in no stop or end
_META = set("\\^$.|?*+()[]{}/")
_CLASS_META = set("\\]^-[")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\f": "\\f", "\v": "\\v"}


def template_regex(template: Sequence[Segment]) -> str:
    """The regex (Python `re.fullmatch` / ECMAScript syntax) of the replies `template` admits:
    its segments' free parts, stops and forced texts in order, nothing after the last."""
    if not template:
        raise ValueError("template_regex needs at least one Segment")
    return "".join(segment_regex(s) for s in template)


def segment_regex(seg: Segment) -> str:
    """One segment: its free part, closed by the stop or by an end (then the stop forced on
    its own line), then the forced text `then`."""
    words = (seg.stop, *seg.ends)
    chars = sorted(set("".join(words)))
    edges: dict[tuple[str, str], list[str]] = {}
    start, final = "S", "F"

    def add(i: str, j: str, r: str) -> None:
        edges.setdefault((i, j), []).append(r)

    add(start, _node(""), char_class({w[0] for w in words}, negated=True))
    todo, seen = [""], {""}
    while todo:
        state = todo.pop()
        targets: dict[str, set[str]] = {}
        for c in [*chars, OTHER]:
            nxt, word = step(state, c, words)
            if word is not None:  # the free part ends: to the node of what is forced next
                nxt = "\0" + ("" if word == seg.stop else
                               ("" if word.endswith("\n") else "\n") + seg.stop)
            targets.setdefault(nxt, set()).add(c)
            if nxt not in seen:
                seen.add(nxt)
                if word is None:
                    todo.append(nxt)
        for nxt, cs in targets.items():
            add(_node(state), _node(nxt), _class_of(cs, chars))
    closes = sorted(s for s in seen if s.startswith("\0"))
    for close in closes:
        add(_node(close), final, escape(close[1:]))
    free = sorted((s for s in seen if not s.startswith("\0")), key=len, reverse=True)
    return _eliminate(edges, [_node(s) for s in closes + free], start, final) + \
        escape(seg.then)


def step(state: str, c: str, words: Sequence[str]) -> tuple[str, str | None]:
    """After `state` (the text's suffix that is a proper prefix of a word) reads `c` (OTHER:
    a character in no word): (next state, None), or ("", word) when `c` completes a word
    (the first of `words` that it completes, as the cursor checks the stop first)."""
    if c == OTHER:
        return "", None
    s = state + c
    for w in words:
        if s.endswith(w):
            return "", w
    for k in range(len(s)):
        if any(w.startswith(s[k:]) for w in words):
            return s[k:], None
    return "", None


def escape(text: str) -> str:
    """`text` as a literal outside a character class."""
    return "".join(_NAMED.get(c) or ("\\" + c if c in _META else _hex(c)) for c in text)


def char_class(chars: Iterable[str], negated: bool = False) -> str:
    """A class of the given characters (or of all others when `negated`); one character alone
    is written as a literal."""
    cs = sorted(set(chars))
    if not negated and len(cs) == 1:
        return escape(cs[0])
    body = "".join(_NAMED.get(c) or ("\\" + c if c in _CLASS_META else _hex(c)) for c in cs)
    return f"[{'^' if negated else ''}{body}]"


def _hex(c: str) -> str:
    return f"\\x{ord(c):02x}" if ord(c) < 0x20 or ord(c) == 0x7f else c


def _node(state: str) -> str:
    return "q" + state


def _class_of(cs: set[str], chars: list[str]) -> str:
    """The class of the labels `cs` (OTHER among them: every character but the word
    characters not in `cs`)."""
    if OTHER in cs:
        return char_class([c for c in chars if c not in cs], negated=True)
    return char_class(cs)


def _alt(parts: Iterable[str]) -> str:
    """Alternation of `parts` (one group, so it concatenates safely); an empty part makes the
    group optional."""
    ps = list(dict.fromkeys(parts))
    if len(ps) == 1:
        return ps[0]
    optional = "" in ps
    ps = [p for p in ps if p]
    if len(ps) == 1 and _atomic(ps[0]):
        body = ps[0]
    else:
        body = "(" + "|".join(ps) + ")"
    return body + "?" if optional else body


def _star(r: str) -> str:
    if not r:
        return ""
    return (r if _atomic(r) else f"({r})") + "*"


def _atomic(r: str) -> bool:
    """Whether `r` is one literal, one class or one group (a quantifier applies to all of
    it)."""
    if len(r) == 1 or (len(r) == 2 and r[0] == "\\"):
        return True
    if r.startswith("\\x") and len(r) == 4:
        return True
    close = {"[": "]", "(": ")"}.get(r[0])
    if close is None:
        return False
    depth, i = 0, 0
    while i < len(r):
        c = r[i]
        if c == "\\":
            i += 2
            continue
        if c == r[0] and (c == "(" or depth == 0):
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i == len(r) - 1
        i += 1
    return False


def _eliminate(edges: dict[tuple[str, str], list[str]], states: list[str], start: str,
               final: str) -> str:
    """State elimination: remove `states` one at a time (the fewest paths through first, ties
    in the order given), leaving the regex of the edge start -> final."""
    label = {k: _alt(v) for k, v in edges.items()}
    left = list(states)

    def cost(k: str) -> int:
        ins = sum(1 for (i, j) in label if j == k and i != k)
        outs = sum(1 for (i, j) in label if i == k and j != k)
        return ins * outs

    while left:
        k = min(left, key=cost)
        left.remove(k)
        loop = _star(label.pop((k, k), ""))
        ins = [(i, r) for (i, j), r in label.items() if j == k]
        outs = [(j, r) for (i, j), r in label.items() if i == k]
        for key in [key for key in label if k in key]:
            del label[key]
        for i, a in ins:
            for j, b in outs:
                through = a + loop + b
                label[(i, j)] = _alt([label[(i, j)], through]) if (i, j) in label else through
    return label[(start, final)]
