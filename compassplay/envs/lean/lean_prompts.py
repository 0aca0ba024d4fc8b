"""The proposer's and the solver's user messages for Lean theorem proving.

The proposer's message does not ask for novelty by default: a renamed copy of the seed is the
shortcut a local reference opens (its gradient equals g_ref), and the paper's ablation measures
how often plain cos takes it; the novelty factor of cos x novelty is what closes it. With
`forbid_copies` (task.lean.forbid_copies) the message also asks for a theorem that is not a
copy or a renaming of the seed (then copy rates no longer measure the reward alone).
"""

from __future__ import annotations

FENCE = "```lean\n"
PROPOSER_OPENING = "You write Lean 4 (Mathlib) theorems for a prover to practise on.\n"
NO_COPIES = "It must not be a copy or a renaming of the theorem above. "


def fenced(code: str) -> str:
    """Lean code as a fenced reply (the form the solver is asked to answer in)."""
    return f"{FENCE}{code.strip()}\n```"


def proposer_prompt(seed_statement: str, seed_proof: str | None, proved: bool = True,
                    forbid_copies: bool = False) -> str:
    """The proposer's message: the seed (and its verified proof, when given), then the ask.
    `proved`: the seed has a verified proof (false: a target shown before any is proved)."""
    shown = f"Statement:\n{fenced(seed_statement + ' := by sorry')}\n"
    if seed_proof:
        shown += f"A verified proof of it:\n{fenced(seed_proof)}\n"
    intro = "Here is a theorem it has proved.\n" if proved else \
        "Here is a theorem it has not proved yet.\n"
    return (PROPOSER_OPENING + intro + shown
            + "Write one theorem related to it, neither trivial nor out of reach for the "
            "prover. " + (NO_COPIES if forbid_copies else "")
            + "Give only its statement, in a ```lean block, ending with `:= by sorry`.")


def solver_prompt(statement: str) -> str:
    return ("Prove the following Lean 4 (Mathlib) theorem. Answer with the complete theorem "
            "and its proof in one ```lean block; do not change the statement.\n"
            f"{fenced(statement + ' := by sorry')}")
