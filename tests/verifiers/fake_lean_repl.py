"""A stand-in for leanprover-community/repl: same JSON protocol, deterministic judging.

Requests are JSON objects separated by blank lines; responses are pretty-printed (multi-line)
JSON objects followed by a blank line, as the real REPL emits them. Rules:
- {"cmd": C} without "env" creates a new environment (imports allowed; `import Nope...` fails
  with an error response); with "env": N it runs in environment N, unknown N ->
  {"message": "Unknown environment."}. Each successful command gets a fresh env id.
- A proof (the text after the first `:=`) containing `sorry` reports a sorry and the
  "declaration uses 'sorry'" warning; one containing `decide`, `rfl`, `norm_num`, `simp` or
  `omega` (and no `False` in the statement) is accepted; anything else gets "unsolved goals".
  A statement naming an identifier `UNKNOWN_...` fails to elaborate ("unknown identifier").
Magic strings in the cmd: FAKE_HANG (never answers), FAKE_CRASH (exits 134 after a panic
line on stderr), FAKE_GARBAGE (a non-JSON block), FAKE_HUGE:<bytes> (a message of that size),
FAKE_OOM (allocates until MemoryError under RLIMIT_AS), FAKE_GROW:<MiB> (keeps that much
resident), FAKE_SLOW:<seconds> (sleeps, then judges normally), FAKE_STDERR (writes to stderr),
FAKE_CHUNKED (the reply arrives in 7-byte writes). FAKE_LEAN_CHECK_DELAY_S in the environment
delays every check by that many seconds.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

ENVS: dict[int, str] = {}
# seconds every command in an environment (a check, not the header) takes before its reply:
# checks in flight long enough for a test to kill the node they run on
CHECK_DELAY_S = float(os.environ.get("FAKE_LEAN_CHECK_DELAY_S", "0"))
HOARD: list[bytes] = []


CHUNKED = False


def reply(obj: dict) -> None:
    text = json.dumps(obj, indent=1, ensure_ascii=False) + "\n\n"
    step = 7 if CHUNKED else len(text)
    for i in range(0, len(text), step):  # FAKE_CHUNKED: many small writes, as a slow pipe
        sys.stdout.write(text[i:i + step])
        sys.stdout.flush()
        if CHUNKED:
            time.sleep(0.002)


def read_request() -> str | None:
    lines: list[str] = []
    for line in sys.stdin:
        if not line.strip():
            if lines:
                return "".join(lines)
            continue
        lines.append(line)
    return "".join(lines) if lines else None


def pos(line: int, col: int) -> dict:
    return {"line": line, "column": col}


def judge(cmd: str, env: int) -> dict:
    out: dict = {"env": env}
    m = re.search(r"\b(theorem|lemma|example)\b", cmd)
    if m is None:
        return out
    line = cmd[:m.start()].count("\n") + 1
    statement, _, proof = cmd[m.start():].partition(":=")
    unknown = re.search(r"\bUNKNOWN_\w*", statement)
    if unknown:
        out["messages"] = [{"severity": "error", "pos": pos(line, 0), "endPos": pos(line, 1),
                            "data": f"unknown identifier '{unknown.group(0)}'"}]
    elif "sorry" in proof:
        col = len(cmd[:cmd.index("sorry")].rsplit("\n", 1)[-1])
        out["sorries"] = [{"proofState": 0, "pos": pos(line, col), "endPos": pos(line, col + 5),
                           "goal": "⊢ " + statement.rsplit(":", 1)[-1].strip()}]
        out["messages"] = [{"severity": "warning", "pos": pos(line, 8), "endPos": pos(line, 9),
                            "data": "declaration uses 'sorry'"}]
    elif "False" not in statement and re.search(r"\b(decide|rfl|norm_num|simp|omega)\b", proof):
        pass
    else:
        out["messages"] = [{"severity": "error", "pos": pos(line, len(statement) + 3),
                            "endPos": pos(line, len(statement) + 5),
                            "data": "unsolved goals\n⊢ " + statement.rsplit(":", 1)[-1].strip()}]
    return out


def handle(req: dict) -> dict | None:
    cmd = req.get("cmd")
    if not isinstance(cmd, str):
        return {"message": "Could not parse as a valid JSON command"}
    if "FAKE_HANG" in cmd:
        time.sleep(3600)
    if "FAKE_CRASH" in cmd:
        sys.stderr.write("INTERNAL PANIC: unreachable code has been reached\n")
        sys.stderr.flush()
        sys.exit(134)
    if "FAKE_GARBAGE" in cmd:
        sys.stdout.write("this is not json\n\n")
        sys.stdout.flush()
        return None
    if "FAKE_OOM" in cmd:
        while True:
            HOARD.append(b"x" * (64 << 20))
    global CHUNKED
    CHUNKED = "FAKE_CHUNKED" in cmd
    if "FAKE_STDERR" in cmd:
        sys.stderr.write("lean: " + "noise " * 20000 + "\n")
    grow = re.search(r"FAKE_GROW:(\d+)", cmd)
    if grow:
        HOARD.append(bytearray(int(grow.group(1)) << 20))
    slow = re.search(r"FAKE_SLOW:([\d.]+)", cmd)
    if slow:
        time.sleep(float(slow.group(1)))
    if "env" in req:
        time.sleep(CHECK_DELAY_S)
        if req["env"] not in ENVS:
            return {"message": "Unknown environment."}
    else:
        bad = re.search(r"^import (Nope\S*)", cmd, re.M)
        if bad:
            return {"message": f"unknown module prefix '{bad.group(1)}'"}
    env = len(ENVS)
    ENVS[env] = cmd
    out = judge(cmd, env)
    huge = re.search(r"FAKE_HUGE:(\d+)", cmd)
    if huge:
        out.setdefault("messages", []).append(
            {"severity": "info", "pos": pos(1, 0), "endPos": pos(1, 1),
             "data": "y" * int(huge.group(1))})
    return out


def main() -> None:
    while True:
        raw = read_request()
        if raw is None:
            return
        try:
            req = json.loads(raw)
        except ValueError as exc:
            reply({"message": f"Could not parse JSON:\n{exc}"})
            continue
        out = handle(req)
        if out is not None:
            reply(out)


if __name__ == "__main__":
    main()
