"""Versioned: a worker that holds weights by version and loads only newer ones."""

from __future__ import annotations

import logging
import time

import torch

from compassplay.config import RunConfig
from compassplay.step.graph import WeightsOffer
from compassplay.sync.channel import NcclChannel, open_channel
from compassplay.sync.packed import unpacked

Weights = dict[str, torch.Tensor]
log = logging.getLogger(__name__)

METRIC_PREFIX = "__compassplay_metric__."
"""Reserved key prefix of the scorer snapshot's metric entries (`with_metric`): no model
parameter name starts with it."""


def with_metric(weights: Weights, metric: dict[str, torch.Tensor]) -> Weights:
    """`weights` plus each metric tensor under `METRIC_PREFIX + name` (one flat state dict:
    the metric travels with the weights of its version)."""
    return {**weights, **{METRIC_PREFIX + n: m for n, m in metric.items()}}


def split_metric(state: Weights) -> tuple[Weights, dict[str, torch.Tensor] | None]:
    """Inverse of `with_metric`: (the weights, the metric by parameter name or None)."""
    metric = {k[len(METRIC_PREFIX):]: v.clone() for k, v in state.items()
              if k.startswith(METRIC_PREFIX)}  # kept past the load: own memory, not the snapshot's
    if not metric:
        return state, None
    return {k: v for k, v in state.items() if not k.startswith(METRIC_PREFIX)}, metric


class Versioned:
    """Holds a weight version; `sync` loads newer weights into every engine it owns.

    With `learner.weight_sync=nccl` the role joins the learner's group once (`init_sync`) and
    then takes each broadcast with `receive(version)`, which loads through `sync`."""

    weight_version: int = 0
    cfg: RunConfig
    channel: NcclChannel | None = None

    def sync(self, weights: Weights | None, version: int) -> None:
        """Load `weights` when `version` is newer than what this role holds."""
        if weights is not None and version > self.weight_version:
            t0 = time.perf_counter()
            self.load_weights(weights, version)
            self.weight_version = version
            log.info("%s: weights v%d loaded in %.2f s (%d tensors)", type(self).__name__,
                     version, time.perf_counter() - t0, len(weights))

    def accept(self, offer: WeightsOffer) -> None:
        """Take the weights a stage is offered when they are newer than those held."""
        if offer.version <= self.weight_version:
            return
        t0 = time.perf_counter()
        state = unpacked(offer.fetch())  # views of the snapshot's buffer: load copies them
        log.info("%s: weights v%d fetched in %.2f s", type(self).__name__, offer.version,
                 time.perf_counter() - t0)
        if state is None:  # nccl sync: the broadcast should have brought this version
            raise RuntimeError(f"step needs weight version {offer.version} but this worker "
                               f"holds {self.weight_version} and got no weights (a restarted "
                               "receiver that missed the broadcast?)")
        self.sync(state, offer.version)

    def load_weights(self, weights: Weights, version: int) -> None:  # pragma: no cover
        raise TypeError(f"{type(self).__name__} holds no weights")

    def init_sync(self, addr: str, port: int, rank: int, world_size: int) -> None:
        """Join the learner's weight-sync group as `rank` (collective with all members)."""
        self.channel = open_channel(self.cfg, addr, port, rank, world_size,
                                    version=self.weight_version)

    def receive(self, version: int | None = None) -> int:
        """Take the broadcast the learner is sending now (`version`: the one announced; None:
        the broadcast's own, refused if older than the one held); returns the version held."""
        if self.channel is None:
            raise RuntimeError("receive() before init_sync(): this role is not in the "
                               "learner's weight-sync group (restarted actor?)")
        state = self.channel.receive(version)
        self.sync(state, self.channel.version)
        return self.weight_version
