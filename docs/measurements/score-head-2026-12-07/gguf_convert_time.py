"""SmolLM2's GGUF -> safetensors conversion with `gguf_read_once` ("once") and without it
("plain": transformers' own three readers), in the order given, each into a fresh folder; with
both, the written files are compared byte for byte.

    python gguf_convert_time.py plain once
"""
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from compassplay.models import loading

d = loading.smollm2_gguf_dir()
outs = {}
for name in sys.argv[1:]:
    tmp = tempfile.mkdtemp()
    t = time.perf_counter()
    if name == "plain":
        import contextlib
        orig = loading.gguf_read_once
        loading.gguf_read_once = contextlib.nullcontext
        loading.convert_gguf(d, loading.SMOLLM2_GGUF, Path(tmp))
        loading.gguf_read_once = orig
    else:
        loading.convert_gguf(d, loading.SMOLLM2_GGUF, Path(tmp))
    print(name, round(time.perf_counter() - t, 1), flush=True)
    outs[name] = tmp
if len(outs) == 2:
    a, b = [load_file(str(Path(v) / "model.safetensors")) for v in outs.values()]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "differ"
    fa, fb = [sorted(p.name for p in Path(v).iterdir()) for v in outs.values()]
    assert fa == fb, (fa, fb)
    for f in fa:
        assert (Path(list(outs.values())[0]) / f).read_bytes() == (Path(list(outs.values())[1]) / f).read_bytes(), f
    print("identical files", fa)
