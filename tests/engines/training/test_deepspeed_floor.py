"""The DeepSpeed floor (issue 37): ZeRO-3 + gradient checkpointing + frozen parameters needs
0.19.3; pyproject, the Makefile and the learner's own check agree."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from compassplay.engines.training.deepspeed import (
    ZERO3_CHECKPOINTING_FROZEN,
    _release,
    check_deepspeed_version,
)

ROOT = Path(__file__).resolve().parents[3]


def _cfg(**kw) -> SimpleNamespace:
    base = {"zero_stage": 3, "gradient_checkpointing": True, "trainable": "last:4"}
    return SimpleNamespace(**{**base, **kw})


def test_pyproject_and_makefile_require_the_fixed_release():
    floor = ".".join(map(str, ZERO3_CHECKPOINTING_FROZEN))
    assert floor == "0.19.3"
    assert f'"deepspeed>={floor},<1"' in (ROOT / "pyproject.toml").read_text()
    assert re.search(rf"install .*'deepspeed>={re.escape(floor)}'",
                     (ROOT / "Makefile").read_text())


def test_an_older_deepspeed_is_refused_only_for_the_failing_combination():
    assert _release("0.19.2+cu124") == (0, 19, 2) and _release("0.19.10") == (0, 19, 10)
    with pytest.raises(ImportError, match=r"0\.19\.2.*CheckpointError.*deepspeed>=0\.19\.3"):
        check_deepspeed_version("0.19.2", _cfg(), frozen=True)
    check_deepspeed_version("0.19.3", _cfg(), frozen=True)
    check_deepspeed_version("0.16.0", _cfg(), frozen=False)  # every parameter trained
    check_deepspeed_version("0.16.0", _cfg(zero_stage=2), frozen=True)
    check_deepspeed_version("0.16.0", _cfg(gradient_checkpointing=False), frozen=True)
