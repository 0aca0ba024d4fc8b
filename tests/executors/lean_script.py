"""Scripted replies for Lean runs, in the test process and in Ray workers.

`install()` patches `HFGenerationEngine.generate` so the tiny model's sampled tokens stay (what
the learner trains on) and the text the stages parse is a scripted reply, chosen by the prompt:
proposer prompts get a renamed copy of the seed (even index) or a new theorem (odd index),
solver prompts a proof the stand-in REPL accepts (even index) or rejects (odd index). Ray
workers run it as `runtime_env={"worker_process_setup_hook": HOOK}` (PYTHONPATH = the repo).
"""

from __future__ import annotations

import re

HOOK = "tests.executors.lean_script.install"


def propose(prompt: str, i: int) -> str:
    seed = re.search(r"```lean\n(theorem .*?) := by sorry", prompt, re.S).group(1)
    if i % 2 == 0:  # a renamed copy of the seed
        return re.sub(r"^theorem \S+", "theorem mine", seed) + " := by sorry\n```"
    return f"theorem mine (k : ℕ) (hk : 0 < k) : k * {i} + 1 = 1 + {i} * k := by sorry\n```"


def solve(prompt: str, i: int) -> str:
    return "by decide\n```" if i % 2 == 0 else "by exact foo\n```"


def install() -> None:
    from compassplay.engines.generation.hf import HFGenerationEngine

    if "_unscripted" in HFGenerationEngine.__dict__:
        return
    real = HFGenerationEngine.generate
    real_each = HFGenerationEngine.generate_each

    def rewrite(self, prompts, gens):
        out = []
        for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
            text = self.tokenizer.decode(p)
            if "You write Lean 4" in text:
                g = g.model_copy(update={"text": propose(text, i)})
            elif "Prove the following Lean 4" in text:
                g = g.model_copy(update={"text": solve(text, i)})
            out.append(g)
        return out

    def generate(self, prompts, params):
        return rewrite(self, prompts, real(self, prompts, params))

    def generate_each(self, prompts, params):  # what the stages call
        return rewrite(self, prompts, real_each(self, prompts, params))

    HFGenerationEngine._unscripted = (real, real_each)
    HFGenerationEngine.generate = generate
    HFGenerationEngine.generate_each = generate_each


def uninstall() -> None:
    from compassplay.engines.generation.hf import HFGenerationEngine

    real = HFGenerationEngine.__dict__.get("_unscripted")
    if real is not None:
        HFGenerationEngine.generate, HFGenerationEngine.generate_each = real
        del HFGenerationEngine._unscripted
