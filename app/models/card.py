"""A model card: what routes, `/api/show`, `/v1/models`, `/status` and the tray know of a
model, whatever engine runs it. Read from the handler (its header or config, loaded or
not), never from a route reading the model's files."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelCard:
    # embedding | generation | rerank | vision | diffusion | speech | speech_synthesis |
    # simulated
    kind: str
    engine: str  # torch | llama.cpp | simulated
    # what it can be asked for, in Ollama's words where Ollama has them: completion, tools,
    # vision (a chat model that sees images), embedding; else ours: rerank, image (an image
    # model's predict), image_generation, transcription (Ollama's routes show only its own)
    capabilities: tuple[str, ...]
    architecture: str  # the family its weights say (llama, bert, ...), else the kind
    format: str  # gguf | safetensors | torchscript | none
    quantization: str  # Q4_1, float16, ...: how its weights are stored
    context_length: int | None = None  # a generation model's tokens per request
    chat_template: str | None = None
    image_size: tuple[int, int] | None = None  # an image generator's (width, height) by default
    labels: tuple[str, ...] = ()  # an image classifier's class names, in its scores' order

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        found["capabilities"] = list(self.capabilities)
        found["labels"] = list(self.labels)
        return found
