"""The run directory: claiming it, the run log and trackers, checkpoints."""
