"""Which block's input states a generator keeps for the learner (`frozen_states_layer`)."""

from pathlib import Path

import pytest

from compassplay.config import load_config
from compassplay.workers.builders import frozen_states_layer
from tests.tiny_models import tiny_causal_lm

MICRO = Path(__file__).resolve().parents[2] / "compassplay" / "configs" / "micro.yaml"


@pytest.mark.parametrize("overrides,want", [
    (["learner.trainable=last:1"], 3),
    (["learner.trainable=last:3"], 1),
    (["learner.trainable=model.layers.2.*"], 2),
    (["learner.trainable=all"], None),  # every block trains: nothing is frozen
    (["learner.trainable=last:4"], None),  # block 0's input is the embedding itself
    (["learner.trainable=last:1", "learner.frozen_states=recompute"], None),
    (["learner.trainable=last:1", "learner.autocast=bfloat16"], 3),  # checked in autocast
    (["learner.trainable=last:1", "learner.backend=deepspeed"], None),
])
def test_the_lowest_trained_block_where_the_learner_can_take_its_states(overrides, want):
    cfg = load_config(MICRO, overrides)
    assert frozen_states_layer(cfg, tiny_causal_lm(num_layers=4)) == want
    assert frozen_states_layer(cfg, None) is None  # a vLLM role holds no model
