"""What the CLI runs: `compassplay run` (launch, dry run), experiments, summaries and plots."""
