"""The old command path of the warm micro model builder, kept working:
`python -m compassplay.models.warm_micro OUT_DIR` runs `python -m compassplay.warmup.warm_micro`.

The builder lives in `compassplay.warmup.warm_micro` (warmup/ sits above models/, so this module
names it by string and imports nothing from it)."""

import runpy

if __name__ == "__main__":
    runpy.run_module("compassplay.warmup.warm_micro", run_name="__main__", alter_sys=True)
