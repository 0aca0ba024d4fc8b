"""Every thread's wakeups (voluntary + involuntary context switches per second, over 10 s) on
the machine while an embedded Ray with N idle actors sits idle; per process and the top 25
threads by (process, thread) name.

    python wakeups.py N DASH    (DASH: 1 = dashboard on, as make run has it)
"""

import collections
import os
import sys
import time

import ray


def snapshot() -> dict[tuple[str, str], tuple[str, str, int]]:
    """(pid, tid) -> (process name, thread name, switches so far)."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            proc = open(f"/proc/{pid}/comm").read().strip()
            for tid in os.listdir(f"/proc/{pid}/task"):
                status = open(f"/proc/{pid}/task/{tid}/status").read()
                name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
                vol = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
                inv = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
                out[(pid, tid)] = (proc, name, vol + inv)
        except (OSError, IndexError):
            pass
    return out


def main(n: int, dash: bool) -> None:
    ray.init(num_cpus=2, include_dashboard=dash, log_to_driver=False)

    @ray.remote(num_cpus=0.1)
    class Idle:
        def ping(self) -> int:
            return os.getpid()

    actors = [Idle.remote() for _ in range(n)]
    ray.get([a.ping.remote() for a in actors])
    time.sleep(5)
    first, t0 = snapshot(), time.time()
    time.sleep(10)
    last, dt = snapshot(), time.time() - t0
    per_proc: collections.Counter = collections.Counter()
    per_thread: collections.Counter = collections.Counter()
    for key, (proc, name, count) in last.items():
        if key in first:
            rate = (count - first[key][2]) / dt
            per_proc[proc] += rate
            per_thread[(proc, name)] += rate
    print(f"total {sum(per_proc.values()):.0f}/s")
    for proc, rate in per_proc.most_common(12):
        print(f"  {proc:24s} {rate:8.0f}")
    print("threads:")
    for (proc, name), rate in per_thread.most_common(25):
        print(f"  {proc:20s} {name:24s} {rate:8.0f}")
    ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "1")
