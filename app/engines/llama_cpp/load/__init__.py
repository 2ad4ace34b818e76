"""A llama.cpp model's load: planned from its GGUF's facts (`plan`: its KV pool and its
layers' split, for the load itself and for `vramgate fits` before a download) and watched
while its runner starts (`phases`, from the engine's own log)."""
