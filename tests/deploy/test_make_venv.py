"""`make setup` on a machine without `python3 -m venv` (Debian/Ubuntu without python3-venv):
it installs what is missing or says what to install, and never leaves a half-made venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fake_bin(tmp_path: Path) -> Path:
    """A python without ensurepip/venv (as Debian ships it) and an apt-get that fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    py = bin_dir / "python3"
    py.write_text(f"""#!/bin/sh
case "$*" in
  *ensurepip*|*"-m venv"*)
    echo "The virtual environment was not created successfully because ensurepip is not
available." >&2; exit 1;;
esac
exec {sys.executable} "$@"
""")
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'apt.log'}\nexit 100\n")
    for f in (py, apt):
        f.chmod(0o755)
    return bin_dir


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_setup_without_venv_support_says_what_to_install(tmp_path):
    bin_dir = _fake_bin(tmp_path)
    venv = tmp_path / "venv"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run(["make", "-C", str(ROOT), f"VENV={venv}",
                           f"PYTHON={bin_dir / 'python3'}", "setup"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    pkg = "python{}.{}-venv".format(*sys.version_info[:2])
    assert f"sudo apt-get install {pkg}" in proc.stderr, proc.stdout + proc.stderr
    assert not venv.exists(), "no half-made venv is left"
    if os.getuid() == 0:  # as root it tried to install the package first
        assert f"install -y -q {pkg}" in (tmp_path / "apt.log").read_text()


def test_a_half_made_venv_is_removed_and_made_again(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/nonexistent/python")  # left by a failed attempt
    proc = subprocess.run(["bash", str(ROOT / "deploy" / "make_venv.sh"), sys.executable,
                           str(venv)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "incomplete" in proc.stdout
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0
