"""The torch engine: in-process models on the inference threads (embeddings, rerank, image
models, speech, diffusion, safetensors LLMs). The only engine that imports torch."""
