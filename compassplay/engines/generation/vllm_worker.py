"""Code that runs inside vLLM worker processes (imported there by vLLM by name).

`WeightSyncWorkerExtension` is passed to ``vllm.LLM(worker_extension_cls=...)``; vLLM mixes it
into its worker (GPU or CPU platform), so its methods are callable through
``llm.collective_rpc(name, args=...)`` on every worker of the engine (one per tensor-parallel
rank) and see the worker's ``get_model()``, ``device``, ``vllm_config`` and ``model_config``.

Every update is loaded the way vLLM's own weight-transfer engines load checkpoint-format
weights: ``initialize_layerwise_reload(model)``, ``model.load_weights(part)`` per part, then
``finalize_layerwise_reload(model, model_config)`` (vllm.model_executor.model_loader.reload).
A plain ``load_weights`` into the running model is wrong wherever vLLM transforms weights after
loading (its CPU platform repacks linear weights; quantized models): layerwise reload restores
the checkpoint layout, loads, and re-runs the post-processing per layer. Transports:

* tensors in the RPC (`compassplay_load_tensors`, object store and the local executor, every
  platform): the engine sends the learner's state in buckets of `bucket_bytes`, each tensor
  as its raw bytes (`sync.buckets.encode_named`: vLLM's RPC decodes arguments without a
  schema, so a large tensor would not arrive); the first bucket starts the reload, the last
  finishes it.
* NCCL (`learner.weight_sync=nccl`, GPU): `compassplay_join_group(host, port, rank_offset,
  world, timeout_s)` once per group, then `compassplay_receive_broadcast(version, src,
  bucket_bytes)` per update while the learner broadcasts (`sync.buckets.NCCLBroadcastSync`,
  each bucket loaded as it arrives). Each worker joins as ``rank_offset + its rank in the
  engine's world`` (`sync.ranks`). Joining again (the group re-forms after a recovery)
  destroys the previous communicator first; a receive that has not finished after
  `timeout_s` aborts its communicator (a watchdog), so a worker whose peer died does not
  stay blocked in NCCL and block every later `collective_rpc` (it must join again).
* CUDA IPC (`learner.weight_sync=ipc`, colocated, GPU): the learner writes a handle file
  (`sync.ipc.publish`); the RPC carries its path, `compassplay_load_ipc` opens this GPU's
  handles.

Every update first abandons a reload an earlier update left unfinished (a failed RPC, a
dropped last bucket), so no weights buffered by it are mixed into the new one. Every loading
method checks the version (an older one is refused with `StaleWeightsError`,
one other than announced is an error) and returns the version it loaded; the engine reports a
new version only when every worker returned it (`VLLMGenerationEngine`). vLLM wraps a worker's
exception into its own error whose message carries the original one.

This module imports vllm only inside methods (the CPU tests also mix the extension into a
fake worker, tests/engines/fake_vllm.py).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from compassplay.sync.buckets import NCCLBroadcastSync, decode_named
from compassplay.sync.identity import device_id
from compassplay.sync.ipc import open_tensor, read_update
from compassplay.sync.pynccl import SYNC_TIMEOUT_S, vllm_broadcast_group
from compassplay.sync.versions import check_offered


class WeightSyncWorkerExtension:
    """Mixed into vLLM's worker: versioned in-place weight loading (tensors, NCCL, CUDA IPC)."""

    _compassplay_version: int = 0
    _compassplay_torn: bool = False  # part of an update may be loaded: weights inconsistent
    _compassplay_reloading: bool = False  # between initialize and finalize of a reload
    _compassplay_comm: Any = None
    _compassplay_timeout_s: float = SYNC_TIMEOUT_S  # of the group joined last

    # ------------------------------------------------------------------ seams (fake: tests)
    def _compassplay_engine_rank(self) -> int:
        """This worker's rank in its engine's world (TP x PP), 0 .. TP*PP-1."""
        from vllm.distributed.parallel_state import get_world_group

        return int(get_world_group().rank)

    def _compassplay_join(self, host: str, port: int, rank: int, world_size: int) -> Any:
        return vllm_broadcast_group(host, port, rank, world_size,
                                    self.device,  # type: ignore[attr-defined]
                                    timeout_s=self._compassplay_timeout_s)

    def _compassplay_begin(self) -> None:
        """Start a layerwise reload (vLLM restores the checkpoint layout of every layer)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            initialize_layerwise_reload(self.get_model())  # type: ignore[attr-defined]

    def _compassplay_load_part(self, named: list[tuple[str, torch.Tensor]]) -> None:
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            self.get_model().load_weights(weights=named)  # type: ignore[attr-defined]

    def _compassplay_finish(self) -> None:
        """Finish the reload: each layer's weights are processed into the kernel layout."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
            finalize_layerwise_reload(self.get_model(),  # type: ignore[attr-defined]
                                      self.model_config)  # type: ignore[attr-defined]
        if self.device.type == "cuda":  # type: ignore[attr-defined]
            torch.cuda.synchronize(self.device)  # type: ignore[attr-defined]

    def _compassplay_device(self) -> str:
        return device_id(self.device)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ one update
    def _compassplay_start(self, held: int, announced: int | None, got: int) -> None:
        """Abandon an unfinished earlier reload, check the version, then start the reload
        (the weights are torn until done)."""
        self._compassplay_abandon()
        check_offered(held, announced, got)
        self._compassplay_torn = True
        self._compassplay_begin()
        self._compassplay_reloading = True

    def _compassplay_load(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Load one part; on failure end the reload (layers not loaded keep their old
        weights, the worker stays torn until a whole update succeeds) and re-raise."""
        try:
            self._compassplay_load_part(named)
        except BaseException:
            self._compassplay_abandon()
            raise

    def _compassplay_abandon(self) -> None:
        if self._compassplay_reloading:
            self._compassplay_reloading = False
            try:
                self._compassplay_finish()
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass

    def _compassplay_done(self, version: int) -> int:
        self._compassplay_reloading = False
        self._compassplay_finish()
        self._compassplay_version, self._compassplay_torn = int(version), False
        return self._compassplay_version

    # ------------------------------------------------------------------ RPC methods
    def compassplay_device_id(self) -> str:
        """This worker's physical device (`sync.identity.device_id`)."""
        return self._compassplay_device()

    def compassplay_weight_version(self) -> int:
        """The version this worker holds, -1 when it holds part of an update."""
        return -1 if self._compassplay_torn else self._compassplay_version

    def compassplay_set_version(self, version: int) -> int:
        """Start from `version` (the engine's initial weights)."""
        self._compassplay_version = int(version)
        return self._compassplay_version

    def compassplay_load_tensors(self, named: list, version: int, first: bool,
                                 final: bool) -> int:
        """One bucket of an update sent in the RPC itself: `named` is `sync.buckets.
        encode_named` of [(name, tensor)] (HF names; loaded into this worker's model). `first` starts the reload (and
        checks the version), `final` finishes it and takes the version (returned; -1 for an
        earlier bucket)."""
        version = int(version)
        if first:
            self._compassplay_abandon()  # an earlier update that never sent its last bucket
            self._compassplay_start(self._compassplay_version, version, version)
        elif not self._compassplay_reloading:
            raise RuntimeError(f"bucket of weight version {version} without its first bucket")
        self._compassplay_load(decode_named(named))
        return self._compassplay_done(version) if final else -1

    def compassplay_join_group(self, host: str, port: int, rank_offset: int,
                               world_size: int, timeout_s: float = SYNC_TIMEOUT_S) -> int:
        """Join the learner's weight-sync group as rank `rank_offset` + this worker's rank in
        the engine's world (destroying the communicator of a group joined before); returns
        that rank. `timeout_s`: how long a receive waits (the store, the watchdog)."""
        rank = int(rank_offset) + self._compassplay_engine_rank()
        if not 0 < rank < world_size:
            raise ValueError(f"weight-sync rank {rank} outside 1..{world_size - 1} "
                             f"(rank_offset {rank_offset}, world size {world_size})")
        self.compassplay_leave_group()
        self._compassplay_timeout_s = float(timeout_s)
        self._compassplay_comm = self._compassplay_join(host, port, rank, world_size)
        return rank

    def compassplay_leave_group(self) -> bool:
        """Destroy this worker's weight-sync communicator, if any; returns whether one was."""
        comm, self._compassplay_comm = self._compassplay_comm, None
        if comm is None:
            return False
        close = getattr(comm, "close", None)
        if close is not None:
            close()
        return True

    def compassplay_receive_broadcast(self, version: int | None, src: int = 0,
                                      bucket_bytes: int = 256 << 20) -> int:
        """Receive the broadcast the learner is sending now and load it bucket by bucket.
        `version`: what the driver announced (None: take the header's, if not older). A
        refused broadcast is drained first so the group stays in step."""
        if self._compassplay_comm is None:
            raise RuntimeError("compassplay_receive_broadcast before compassplay_join_group")
        sync = NCCLBroadcastSync(self._compassplay_comm, src=src, bucket_bytes=bucket_bytes,
                                 device=self.device)  # type: ignore[attr-defined]
        got, parts = sync.receive_buckets()  # the header: the store waits up to timeout_s
        # the buckets: NCCL has no timeout of its own, so a watchdog aborts a stuck one
        watchdog = threading.Timer(self._compassplay_timeout_s, self._compassplay_expire)
        watchdog.daemon = True
        watchdog.start()
        try:
            try:
                self._compassplay_start(self._compassplay_version, version, got)
                for part in parts:
                    self._compassplay_load(part)
            except Exception:
                for _ in parts:  # drain: every rank takes part in every bucket
                    pass
                raise
            return self._compassplay_done(got)
        except Exception as exc:
            if self._compassplay_comm is None:  # the watchdog aborted the communicator
                raise RuntimeError(f"weight broadcast not received within "
                                   f"{self._compassplay_timeout_s:.0f} s of its header: "
                                   "communicator destroyed, join the group again") from exc
            raise
        finally:
            watchdog.cancel()

    def _compassplay_expire(self) -> None:
        """The watchdog: abort the communicator a receive is still blocked in."""
        self.compassplay_leave_group()

    def compassplay_load_ipc(self, path: str, version: int) -> int:
        """Load the tensors a colocated producer published in handle file `path` for this
        worker's GPU (CUDA IPC); returns the version loaded."""
        self._compassplay_abandon()  # before any check: no stale reload stays open
        update = read_update(path)
        mine = update["by_device"].get(self._compassplay_device())
        check_offered(self._compassplay_version, int(version), int(update["version"]))
        if mine is None:
            raise RuntimeError(f"no weights for this worker's device {self._compassplay_device()}"
                               f" in {path} (published for {sorted(update['by_device'])}): with "
                               "learner.weight_sync=ipc the engine must share the learner's GPU")
        index = self.device.index  # type: ignore[attr-defined]
        named = [(name, open_tensor(handle, index)) for name, handle in mine]
        self._compassplay_start(self._compassplay_version, int(version), int(version))
        self._compassplay_load(named)
        del named
        return self._compassplay_done(int(version))
