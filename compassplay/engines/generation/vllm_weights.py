"""Weight sync into a running vLLM engine: one function per transport, in one place.

Each sends the RPCs of one transport to every worker of the engine (`rpc(method, *args)`:
``LLM.collective_rpc`` on `vllm_worker.WeightSyncWorkerExtension`, one result per worker) and
returns what every worker returned: the weight version it holds after the load.
`VLLMGenerationEngine._load` wraps each one (wake the weights, check every worker's version,
wake the KV cache), so the engine's public loads stay one line per transport.

* `object_store`: the state dict travels in the RPC itself as raw bytes
  (`sync.buckets.encode_named`), `bucket_bytes` at a time (the object store, and the local
  executor; every platform);
* `ipc`: CUDA IPC handles a colocated learner published at a path (`sync.ipc`; GPU);
* `nccl`: the broadcast the learner sends now, over the group `join_nccl_group` made every
  worker join (`sync.pynccl`; GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from compassplay.engines.generation.vllm_support import buckets
from compassplay.sync.buckets import encode_named

#: `rpc(method, *args)`: call `method` of the worker extension on every worker, their results
Rpc = Callable[..., list[Any]]


def object_store(rpc: Rpc, state: dict[str, torch.Tensor], version: int,
                 bucket_bytes: int) -> list[int]:
    """Send `state` (HF names) in `bucket_bytes`-sized buckets; the first bucket starts the
    layerwise reload, the last one finishes it. Returns the workers' versions after the last."""
    parts = list(buckets(state, bucket_bytes))
    got: list[int] = []
    for i, part in enumerate(parts):
        got = rpc("compassplay_load_tensors", encode_named(part), version, i == 0,
                  i == len(parts) - 1)
    return got


def ipc(rpc: Rpc, path: str, version: int) -> list[int]:
    """Load the CUDA IPC handles a producer (the learner) published at `path`."""
    return rpc("compassplay_load_ipc", path, version)


def nccl(rpc: Rpc, version: int | None, src: int, bucket_bytes: int) -> list[int]:
    """Receive the broadcast rank `src` sends now (`version`: the one announced; None: the
    header's). The workers always drain it, so the group stays in step."""
    return rpc("compassplay_receive_broadcast", version, src, bucket_bytes)


def join_nccl_group(rpc: Rpc, host: str, port: int, rank_offset: int, world_size: int,
                    timeout_s: float) -> list[int]:
    """Make every worker join the learner's NCCL group as ranks rank_offset ..
    rank_offset + workers - 1 (RuntimeError otherwise); returns the ranks joined."""
    ranks = rpc("compassplay_join_group", host, port, rank_offset, world_size, float(timeout_s))
    if sorted(ranks) != list(range(rank_offset, rank_offset + len(ranks))):
        raise RuntimeError(f"vLLM workers joined the weight-sync group as ranks {ranks}, "
                           f"expected {rank_offset}..{rank_offset + len(ranks) - 1}")
    return ranks
