"""Does a seeded batch whose prefill is split across steps kill vLLM's CPU engine?"""
import sys
import time

from compassplay.config import ModelSection
from compassplay.engines import SamplingParams
from compassplay.engines.generation import vllm as vg
from compassplay.models.loading import model_cache_dir, prepare_smollm2

if __name__ == "__main__":
    fix = sys.argv[1] == "fix"
    if not fix:
        vg.cpu_scheduler_kwargs = lambda model, kw, role: {}
    path = prepare_smollm2(model_cache_dir(ModelSection(source="smollm2-gguf")))
    eng = vg.VLLMGenerationEngine(str(path), dtype="float32", enforce_eager=True,
                                  max_model_len=256, kv_cache_bytes=64 << 20,
                                  max_num_batched_tokens=512)
    for n, plen, new in ((3, 200, 6), (6, 120, 8)):
        prompts = [[11 + (i * 7 + k) % 300 for k in range(plen)] for i in range(n)]
        t = time.time()
        try:
            g = eng.generate(prompts, SamplingParams(max_new_tokens=new, temperature=1.0, seed=7))
            print("RESULT", n, plen, "ok", [x.finish_reason for x in g], round(time.time() - t, 1), flush=True)
        except Exception as e:
            print("RESULT", n, plen, "CRASH", type(e).__name__, str(e)[:150], flush=True)
            break
    eng.shutdown()
