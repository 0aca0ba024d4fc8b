"""`compassplay bench gpu` on CPU: the same code path as on a GPU, at the toy shape."""

import json
import subprocess
import sys

import pytest
import torch

from compassplay.bench import gpu, model_shapes

CHECK = r"""
import json, sys
from compassplay.bench import gpu
code = gpu.main(sys.argv[1:])
heavy = sorted(m for m in ("ray", "vllm", "deepspeed") if m in sys.modules)
print(json.dumps({"exit": code, "heavy": heavy}))
"""


def test_gpu_check_runs_every_part_without_ray_vllm_or_deepspeed(tmp_path):
    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--shapes", "toy", "--seq-len", "16", "--n-candidates", "2",
            "--reps", "1", "--fp32-check", "2", "--gen-shape", "toy", "--gen-batch", "2",
            "--gen-tokens", "6", "--skip", "deepspeed", "--json", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-c", CHECK, *args], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tail = json.loads(proc.stdout.strip().splitlines()[-1])
    assert tail == {"exit": 0, "heavy": []}
    result = json.loads(out.read_text())
    assert result["failed"] == []
    sc = result["scorer"]["toy"]
    assert sc["dtype"] == "bfloat16" and sc["n_candidates"] == 2
    assert sc["max_abs_cos_err"] < 1e-2  # bf16 batched vs bf16 naive
    assert 0 <= sc["cos_err_vs_fp32"] < 5e-2 and sc["fp32_check_candidates"] == 2
    assert sc["floor_ratio"] > 0 and sc["candidates_per_s"] > 0
    assert result["generate"]["new_tokens"] == 12  # EOS off: every completion is full length
    assert result["learn"]["max_weight_change"] > 0 and result["learn"]["tokens"] == 12
    assert "[gpu check] learn: ok" in proc.stderr


@pytest.mark.slow
def test_deepspeed_part_steps_offloads_and_restores(tmp_path):
    """The optional DeepSpeed part (CPU accelerator here, CUDA on a GPU): ZeRO-3 and ZeRO-2 with
    the optimizer offloaded each take a step that moves the weights, and the ZeRO-3 checkpoint
    loads into a fresh learner with the same weights."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--skip", "scorer", "learn", "--gen-shape", "toy",
            "--gen-batch", "2", "--gen-tokens", "6", "--json", "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "compassplay.bench.gpu", *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ds = json.loads(out.read_text())["deepspeed"]
    for name in ("zero3", "zero2_offload_optimizer"):
        assert ds[name]["max_weight_change"] > 0, ds
        assert ds[name]["grad_norm"] > 0
    assert ds["zero3"]["checkpoint_max_abs_diff"] == 0.0
    assert ds["zero3"]["checkpoint_weight_version"] == 1


def test_a_failing_part_is_reported_and_sets_the_exit_code():
    result = {"scorer": {"toy": {"error": "OutOfMemoryError: ..."}}, "generate": {},
              "learn": {"error": "RuntimeError: x"}}
    assert gpu.failed_parts(result) == ["scorer toy", "learn"]
    assert gpu.exit_code({"failed": ["learn"]}) == 1 and gpu.exit_code({"failed": []}) == 0


def test_real_shapes_have_the_published_sizes():
    # Built on the meta device: shapes without memory. Parameter counts of the published models.
    counts = {}
    for name in ("smollm2-135m", "qwen2.5-1.5b", "qwen2.5-7b"):
        counts[name] = model_shapes.param_count(model_shapes.build(name, device="meta"))
    assert counts["smollm2-135m"] == 134_515_008
    assert counts["qwen2.5-1.5b"] == 1_543_714_304
    assert counts["qwen2.5-7b"] == 7_615_616_512
    model = model_shapes.build("qwen2.5-7b", torch.bfloat16, device="meta")
    assert next(model.parameters()).dtype == torch.bfloat16
