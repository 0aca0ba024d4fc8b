"""The proposer's and the solver's user messages for Lean theorem proving."""

from __future__ import annotations

FENCE = "```lean\n"


def fenced(code: str) -> str:
    """Lean code as a fenced reply (the form the solver is asked to answer in)."""
    return f"{FENCE}{code.strip()}\n```"


def proposer_prompt(seed_statement: str, seed_proof: str | None) -> str:
    shown = f"Statement:\n{fenced(seed_statement + ' := by sorry')}\n"
    if seed_proof:
        shown += f"A verified proof of it:\n{fenced(seed_proof)}\n"
    return ("You write new Lean 4 (Mathlib) theorems for a prover to practise on.\n"
            f"Here is a theorem it has proved.\n{shown}"
            "Write one new theorem inspired by it: related, not a copy or a renaming, and "
            "neither trivial nor out of reach. Give only its statement, in a ```lean block, "
            "ending with `:= by sorry`.")


def solver_prompt(statement: str) -> str:
    return ("Prove the following Lean 4 (Mathlib) theorem. Answer with the complete theorem "
            "and its proof in one ```lean block; do not change the statement.\n"
            f"{fenced(statement + ' := by sorry')}")
