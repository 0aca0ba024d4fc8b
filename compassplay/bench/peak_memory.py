"""Peak memory of a piece of work, for the benches: torch allocations (the profiler's memory
events on CPU, the allocator's peak on CUDA) or the process's peak RSS (Linux)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def peak_alloc_mb(fn: Callable[[], object], device: torch.device | None = None) -> float:
    """Peak (MiB) of torch tensor bytes allocated and still live during `fn`. CPU: from the
    profiler's memory events (per-op net allocations and frees, in time order); CUDA: the
    allocator's peak minus what was allocated before."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()
                    if e.self_cpu_memory_usage)
    cur = best = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return round(best / 2**20, 1)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark (Linux) and return the current RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


def peak_rss() -> int:
    """The kernel's peak-RSS mark (Linux, bytes) since the last `reset_peak_rss`."""
    return _status_bytes("VmHWM")


def sync(dev: torch.device) -> None:
    """Wait for the device's queued work (CUDA); a no-op on CPU."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
