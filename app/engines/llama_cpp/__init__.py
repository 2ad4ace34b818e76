"""llama.cpp's engine: GGUF models in a runner process each (xllamacpp): the runner's own
main, its process and client, the handlers, and how many layers go to the GPU."""
