"""Copies and renames of shown references among coding proposals (the local-reference shortcut).

With a local reference (reward.reference=local) a proposal is rewarded by its alignment with
the gradient of its own seed's solution, so re-emitting the seed is the shortcut; these
measures show whether it appears:
- copy: token Jaccard of what the proposer wrote to the closest shown reference above
  `COPY_JACCARD` (the paper's 0.8), on the tokens novelty uses (`reward.novelty_tokenizer`:
  the run passes its tokenizer; regex tokens when none is given);
- rename: the program equals a shown reference program up to a renaming of its identifiers
  (arguments, locals, inner functions; builtins and attributes keep their names), with the
  same input (deduction/abduction only: an induction proposal is given its program).
Both are taken over a step's in-band proposals (valid, 0 < s < 1), as in the paper.
"""

from __future__ import annotations

import ast
import builtins

from compassplay.rewards.functions import Tokenize, regex_tokenize, token_jaccard

COPY_JACCARD = 0.8
_BUILTINS = frozenset(dir(builtins))


class _Canonical(ast.NodeTransformer):
    """Renames every bound identifier to v0, v1, ... in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _name(self, name: str) -> str:
        if name in _BUILTINS and name not in self.names:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._name(node.arg)
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = self._name(node.name)
        node.returns = None
        self.generic_visit(node)
        return node


def alpha_normal_program(source: str) -> str | None:
    """The program's AST dump with identifiers renamed canonically; None if it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    return ast.dump(_Canonical().visit(tree), annotate_fields=False)


def is_copy(text: str, references: list[str], tokenize: Tokenize = regex_tokenize) -> bool:
    """`text` is within COPY_JACCARD of some reference text (token Jaccard of `tokenize`)."""
    mine = tokenize(text)
    return any(token_jaccard(mine, tokenize(r)) > COPY_JACCARD for r in references)


def is_rename(text: str, references: list[str]) -> bool:
    """`text` equals one of `references` up to renaming of identifiers. Texts are novelty
    texts (`CodeEnvironment.novelty_text`): a program followed by its input, which parses as
    one module (the input is an expression statement), so the input must match too; an
    induction text (inputs and a prose message) does not parse and is never a rename."""
    mine = alpha_normal_program(text)
    return mine is not None and any(alpha_normal_program(r) == mine for r in references)


def copy_and_rename_rates(texts: list[tuple[str, list[str]]],
                          tokenize: Tokenize = regex_tokenize) -> dict[str, float]:
    """copy_rate and rename_rate over (what a proposer wrote, the references it was shown)
    pairs, copies on `tokenize`'s tokens; 0.0 for no pairs."""
    n = len(texts)
    copies = sum(is_copy(t, refs, tokenize) for t, refs in texts)
    renames = sum(is_rename(t, refs) for t, refs in texts)
    return {"copy_rate": copies / n if n else 0.0, "rename_rate": renames / n if n else 0.0}
