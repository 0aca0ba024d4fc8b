"""Where a learner checkpoint keeps each model's HF folder."""

from __future__ import annotations

from pathlib import Path

PROPOSER_MODEL = "proposer_model"


def model_dirs(path: str | Path, model_dir: str | Path | None) -> dict[str, Path]:
    """Where `PolicyLearner.save(path, model_dir)` puts each model's HF folder, by slot name:
    the policy (or solver) in `model_dir`, a separate proposer in `model_dir`'s sibling
    `proposer_model/`; with no `model_dir`, in `path` and `path/proposer` (the optimizer's
    folders)."""
    path = Path(path)
    if model_dir is None:
        return {"policy": path, "solver": path, "proposer": path / "proposer"}
    model_dir = Path(model_dir)
    return {"policy": model_dir, "solver": model_dir,
            "proposer": model_dir.parent / PROPOSER_MODEL}
