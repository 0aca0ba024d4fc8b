"""Warm-ups before self-play: the format bootstrap, the SFT pieces, the warm micro model."""
