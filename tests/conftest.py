"""Suite-wide settings: the many runs on an embedded Ray start no Ray dashboard (each would
cost a process and its start-up time); tests/executors/ray/test_dashboard.py turns it on."""

import os

os.environ.setdefault("COMPASSPLAY_RAY_DASHBOARD", "0")
