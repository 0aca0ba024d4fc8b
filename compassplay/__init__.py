"""CompassPlay: self-play RL for language models with gradient-alignment proposer rewards."""

__version__ = "0.1.0"
