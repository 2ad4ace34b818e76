"""The models on disk: `pull` (sources, recognising a model, GGUF conversion), the config
file's [[models]] tables, the models folder, and the commands that manage them."""
