"""Ollama's API (`/api/...`): its bodies translated into the chat, completion and
embedding requests the core takes, and its answers."""
