"""The torch engine's text generation: causal LMs and vision-language chat, every stream
of a model batched step by step (KV caches, packed prefills, sampling, constrained
decoding)."""
