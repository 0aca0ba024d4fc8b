"""The learner: interface, torch and DeepSpeed backends, advantages, log-probs, PPO loss."""
