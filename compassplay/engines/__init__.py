"""Generation engines (HF, vLLM), the policy-gradient learner (torch, DeepSpeed) and weight sync.

Heavy optional backends (vllm, deepspeed) are imported only when chosen.
"""

from compassplay.engines.factory import make_generation_engine, make_learner
from compassplay.engines.generation.base import (
    GenerationEngine,
    SamplingParams,
    StaleWeightsError,
)
from compassplay.engines.training.learner import Learner, LearnerStats

__all__ = ["GenerationEngine", "Learner", "LearnerStats", "SamplingParams",
           "StaleWeightsError", "make_generation_engine", "make_learner"]
