"""`compassplay bench sync`: a weight snapshot's trip through Ray's object store, packed
(`sync.packed`, what the executors send) against a plain state dict of tensors (what they sent
before), beside the bound the machine sets, all measured in one run.

A producer actor holds the model (as the learner does) and a receiver actor holds a copy (as a
generator or scorer does), both on the local node. Per mode and repetition:
- `snapshot_s`: from the driver's call until the state is in the object store (the learner
  shell's `snapshot` call: read the weights, serialize, store);
- `fetch_s`: the receiver's `ray.get` (+ `unpack`): deserialize or map;
- `load_s`: `load_state_dict` into the receiver's model (a copy of every byte, either mode);
- `total_s`: their sum, the time a step waits for one receiver's new weights.
The bound is two copies of the snapshot's bytes (into the store, out into the receiver's
weights) at the rate this process copies memory (`copy_gb_per_s`, best of `settled` rounds);
`of_bound` = bound / total_s. Medians over `--reps`.

    compassplay bench sync --json [--model micro|smollm2] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch

from compassplay.bench import roofline
from compassplay.config import ModelSection
from compassplay.models.loading import load_model
from compassplay.sync.packed import PackArena, PackedWeights, unpacked

MODELS = {"micro": ModelSection(source="tiny"), "smollm2": ModelSection(source="smollm2-gguf")}
MODES = ("plain", "packed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `bench sync`."""
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--reps", type=int, default=5, help="snapshots per mode")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")


def plain_snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What the learner sent before packing: a CPU copy per state-dict name."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@ray.remote(num_cpus=0)
class _Producer:
    def __init__(self, section: ModelSection) -> None:
        self.model, _ = load_model(section)
        self.arena = PackArena()

    def snapshot(self, mode: str) -> object:
        live = {k: v.detach() for k, v in self.model.state_dict().items()}
        return PackedWeights.pack(live, self.arena) if mode == "packed" else plain_snapshot(
            self.model)


@ray.remote(num_cpus=0)
class _Receiver:
    def __init__(self, section: ModelSection) -> None:
        self.model, _ = load_model(section)

    def take(self, box: list) -> tuple[float, float]:
        """(seconds to fetch and unpack, seconds to load) of the snapshot in `box`."""
        t0 = time.perf_counter()
        state = unpacked(ray.get(box[0]))
        t1 = time.perf_counter()
        self.model.load_state_dict(state)
        return t1 - t0, time.perf_counter() - t1


def copy_rate(nbytes: int) -> float:
    """Bytes per second of one in-process copy of `nbytes` (warm buffers, best of rounds)."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)

    def once() -> float:
        t0 = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t0

    return nbytes / roofline.settled(lambda: min(once() for _ in range(3)), min)


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _trip(producer, receiver, mode: str) -> dict[str, float]:
    t0 = time.perf_counter()
    state = producer.snapshot.remote(mode)
    ray.wait([state], fetch_local=False)
    snap = time.perf_counter() - t0
    fetch, load = ray.get(receiver.take.remote([state]))
    del state
    return {"snapshot_s": snap, "fetch_s": fetch, "load_s": load,
            "total_s": snap + fetch + load}


def run(args: argparse.Namespace) -> dict:
    """Both modes, `args.reps` each (alternating after one warm-up each); the JSON object."""
    section = MODELS[args.model]
    model, _ = load_model(section)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    packed_bytes = PackedWeights.pack(model.state_dict()).nbytes
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        producer, receiver = _Producer.remote(section), _Receiver.remote(section)
        for mode in MODES:  # warm-up: first allocations, first store
            _trip(producer, receiver, mode)
        trips: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for _ in range(max(1, args.reps)):
            for mode in MODES:
                trips[mode].append(_trip(producer, receiver, mode))
    finally:
        if started:
            ray.shutdown()
    rate = copy_rate(packed_bytes)
    bound = 2 * packed_bytes / rate
    out: dict = {"model": args.model, "state_dict_bytes": nbytes, "packed_bytes": packed_bytes,
                 "copy_gb_per_s": _sig(rate / 1e9), "bound_s": _sig(bound),
                 "reps": max(1, args.reps), "threads": torch.get_num_threads()}
    for mode, rows in trips.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        out[mode] = {**{k: _sig(v) for k, v in med.items()},
                     "of_bound": _sig(bound / med["total_s"])}
    out["packed_speedup"] = _sig(out["plain"]["total_s"] / out["packed"]["total_s"])
    return out
