"""One SmolLM2 generate call (16 x 64 + 96 new, bfloat16, fused kernels), 5 timed calls:
in this process (`local`), in a Ray actor alone (`ray-0`), or beside N idle actors
(`ray-N`, `ray-N-dash` with the dashboard). Prints (fastest s, median s, involuntary context
switches per call, the OMP_NUM_THREADS the process saw).

    PYTHONPATH=<checkout> python actor_gen.py local|ray-0|ray-5-dash
"""

import os
import resource
import statistics
import sys
import time

import torch


def bench() -> tuple[float, float, float, str | None]:
    from compassplay.bench.generate import MODELS
    from compassplay.engines import SamplingParams
    from compassplay.engines.generation.hf import HFGenerationEngine
    from compassplay.models import load_model

    torch.set_num_threads(2)
    model, tok = load_model(MODELS["smollm2"], seed=0)
    engine = HFGenerationEngine(model, tok, eos_token_id=-1, decode_dtype="bfloat16")
    prompts = torch.randint(0, 256, (16, 64),
                            generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_new_tokens=96, temperature=1.0, seed=0)
    engine.generate(prompts, params)
    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(5):
        t0 = time.perf_counter()
        engine.generate(prompts, params)
        times.append(time.perf_counter() - t0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (min(times), statistics.median(times), (after.ru_nivcsw - before.ru_nivcsw) / 5,
            os.environ.get("OMP_NUM_THREADS"))


def main(mode: str) -> None:
    if mode == "local":
        print("local", bench())
        return
    import ray

    ray.init(num_cpus=2, include_dashboard=mode.endswith("dash"), log_to_driver=False)

    @ray.remote(num_cpus=0.1)
    class Idle:
        def ping(self) -> int:
            return 1

    @ray.remote(num_cpus=1)
    class Gen:
        def run(self) -> tuple:
            return bench()

    idle = [Idle.remote() for _ in range(int(mode.split("-")[1]))]
    ray.get([a.ping.remote() for a in idle])
    print(mode, ray.get(Gen.remote().run.remote()))
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
