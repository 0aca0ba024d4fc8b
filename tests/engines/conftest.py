"""Shared fixtures: a byte-level tokenizer and seeded tiny Qwen2 models (no files, no network)."""

from __future__ import annotations

import pytest

from compassplay.config import LearnerSection
from compassplay.models.byte_tokenizer import build_byte_tokenizer
from tests.tiny_models import tiny_causal_lm


@pytest.fixture(scope="session")
def tokenizer():
    return build_byte_tokenizer()


@pytest.fixture
def model():
    return tiny_causal_lm(seed=0)


@pytest.fixture
def learner_cfg():
    return LearnerSection(lr=1e-2, micro_batch=2, max_grad_norm=1.0, clip_eps=0.2)
