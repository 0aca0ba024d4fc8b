import glob
import json
import sys
import time

# every second: for processes whose cmdline starts with ray::ProposerActor / SolverActor / ScorerActor / LearnerActor, record nonvoluntary switches summed over threads
last = {}
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for p in glob.glob("/proc/[0-9]*"):
        try:
            cmd = open(p + "/cmdline").read()
        except OSError:
            continue
        if not cmd.startswith("ray::") or "Actor" not in cmd.split("\0")[0]:
            continue
        name = cmd.split("\0")[0].split()[0][:22]
        tot = 0
        for t in glob.glob(p + "/task/*/status"):
            try:
                for line in open(t):
                    if line.startswith("nonvoluntary"):
                        tot += int(line.split()[1])
            except OSError:
                pass
        last[name] = tot
    time.sleep(1)
print(json.dumps(last))
