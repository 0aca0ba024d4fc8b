"""Generation engines (HF, vLLM) behind `base.GenerationEngine`, with templated decoding."""
