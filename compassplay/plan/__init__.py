"""Pure planning from the config: GPU memory, tensor shapes, Ray resources (no Ray, no models)."""
