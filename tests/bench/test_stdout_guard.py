"""`compassplay bench NAME --json` prints one JSON object on stdout even when the bench (or a
process it starts, as vLLM's engine core does) writes log lines to stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from compassplay import cli
from compassplay.bench import generate


def _noisy_run(args):
    print("INFO a log line from Python")
    os.write(1, b"INFO a log line written to fd 1\n")
    subprocess.run([sys.executable, "-c", "print('INFO a child process logs')"], check=True)
    return {"tokens_per_s": 1.5}


def test_json_stdout_holds_only_the_object_and_the_noise_goes_to_stderr(capfd, monkeypatch):
    monkeypatch.setattr(generate, "run", _noisy_run)
    assert cli.main(["bench", "generate", "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out) == {"tokens_per_s": 1.5}
    for line in ("from Python", "written to fd 1", "a child process logs"):
        assert line in err
    print("stdout is back")
    assert capfd.readouterr().out == "stdout is back\n"


def test_generate_module_main_json_is_parseable(capfd, monkeypatch):
    monkeypatch.setattr(generate, "run", _noisy_run)
    assert generate.main(["--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out) == {"tokens_per_s": 1.5} and "a child process logs" in err
