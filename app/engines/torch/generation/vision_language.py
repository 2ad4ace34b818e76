"""Chat with images: a generation model that transformers loads as image-text-to-text
(`AutoModelForImageTextToText` and its `AutoProcessor`: LLaVA, Idefics3/SmolVLM, ...).

The processor renders the chat with its own template, each image where its message's
placeholder is (a message's images before its text, as Ollama's messages carry them),
expands every placeholder into the image's tokens and makes the pixels. A prompt with
images is prefilled alone and in one forward, the vision encoder and projector inside it
(their activations are that prefill's cost); from then on its row is an ordinary text row
that joins the step batch (`step_batch`, beside this module), since the KV cache of these
families is a text model's. Its KV depends on the images, which its token ids do not identify: it
is never copied from a running row nor kept in the prefix cache.

Priced as any generation by its prompt's tokens (the image tokens included) under a
price key of its own (`+images`), with the vision encoder's activations for as many
images as the prompt can hold added to the geometry's estimate until measured.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.engines.torch.generation.causal_lm import CausalLMHandler, source_of
from app.errors import InvalidRequest
from app.models.chat.reasoning import Frame
from app.models.decoding import Chat, Prompt
from app.models.images import decode_rgb
from app.models.tools import chat_messages, template_knows_tools
from app.sched.budget import Geometry

PROBE_SIDE = 64  # the blank image that measures how many tokens an image takes


def processor_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as processors' templates take them: content a list of parts, a message's
    images (`{"type": "image"}`) before its text."""
    shaped = []
    for message in messages:
        message = dict(message)
        images = message.pop("images", None) or []
        text = message.get("content") or ""
        parts: list[dict[str, Any]] = [{"type": "image"} for _ in images]
        message["content"] = (
            [*parts, {"type": "text", "text": text}] if text or not parts else parts
        )
        shaped.append(message)
    return shaped


class VisionLanguageHandler(CausalLMHandler):
    def __init__(self, spec: ModelSpec, max_side: int, max_pixels: int) -> None:
        super().__init__(spec)
        self.max_side, self.max_pixels = max_side, max_pixels
        self._processor: Any = None
        self._image_tokens = 1  # prompt tokens one image takes (measured at load)
        self._vision_bytes = 0  # one image's vision-encoder activations (estimated)

    def _load_files(self, dtype: torch.dtype) -> tuple[Any, Any]:
        folder, extra = source_of(self.path)
        if extra or not folder.exists():
            raise FileNotFoundError(f"{self.path} is no vision-language model folder")
        processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
        model = AutoModelForImageTextToText.from_pretrained(
            folder, local_files_only=True, dtype=dtype, use_safetensors=True
        )
        self._processor = processor
        return processor.tokenizer, model

    def load(self, device: Device) -> None:
        super().load(device)
        self._image_tokens = self._tokens_per_image()
        self._vision_bytes = self._vision_activations()

    def unload(self) -> None:
        super().unload()
        self._processor = None

    def capabilities(self) -> tuple[str, ...]:
        return (*super().capabilities(), "vision")

    # -- the prompt -----------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        return self.encode_inputs(prompt)[0]

    def encode_inputs(
        self, prompt: Prompt
    ) -> tuple[list[int], dict[str, Any] | None, Frame | None]:
        if isinstance(prompt, str):
            return super().encode(prompt), None, None
        text = self._render(prompt)
        images = [self._image(data) for m in prompt.messages for data in m.get("images") or ()]
        bos = getattr(self._tokenizer, "bos_token", None)
        special = not (bos and text.startswith(bos))  # the template wrote its own
        out = self._processor(
            text=text, images=images or None, return_tensors="pt", add_special_tokens=special
        )
        ids = [int(i) for i in out["input_ids"][0]]
        inputs = {
            name: value
            for name, value in out.items()
            if name not in ("input_ids", "attention_mask") and isinstance(value, torch.Tensor)
        }
        return ids, (inputs if images else None), None  # its templates do not think in tags

    def _render(self, prompt: Chat) -> str:
        template = getattr(self._processor, "chat_template", None) or getattr(
            self._tokenizer, "chat_template", None
        )
        if not template:
            raise InvalidRequest(
                f"model {self.name!r} has no chat template; use /v1/completions",
                param="model",
            )
        knows = template_knows_tools(template)
        messages = processor_messages(chat_messages(prompt.messages, prompt.tools, knows))
        tools = prompt.tools if knows else None
        return str(
            self._processor.apply_chat_template(
                messages,
                chat_template=template,
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
            )
        )

    def _image(self, data: bytes) -> Image.Image:
        """A checked image, decoded (the route checked its header; this checks it whole)."""
        return Image.fromarray(decode_rgb(data, self.max_side, self.max_pixels))

    # -- its price ------------------------------------------------------------------------
    def _tokens_per_image(self) -> int:
        """The prompt tokens one image takes: a one-image chat's less a text-only one's."""
        blank = Image.new("RGB", (PROBE_SIDE, PROBE_SIDE))
        chat = [{"role": "user", "content": "ok"}]
        try:
            text_only = len(self.encode(Chat(chat)))
            with_image = self._processor(
                text=self._render(Chat([{**chat[0], "images": [b""]}])),
                images=[blank],
                return_tensors="pt",
            )["input_ids"].shape[1]
        except Exception:  # no template, or a processor that wants more: priced by tokens
            return 1
        return max(1, int(with_image) - text_only)

    def _vision_activations(self) -> int:
        """One image's vision-encoder activations, from its config: each layer's hidden
        states kept (for the feature layer), its widest MLP, the attention scores."""
        vision = getattr(self._model.config, "vision_config", None)
        if vision is None:
            return 0
        element = torch.finfo(self._model.dtype).bits // 8
        hidden = int(getattr(vision, "hidden_size", 0) or 0)
        inner = int(getattr(vision, "intermediate_size", 4 * hidden) or 4 * hidden)
        layers = int(getattr(vision, "num_hidden_layers", 1) or 1)
        heads = int(getattr(vision, "num_attention_heads", 1) or 1)
        size, patch = getattr(vision, "image_size", 0), getattr(vision, "patch_size", 0)
        patches = (int(size) // int(patch)) ** 2 + 1 if size and patch else self._image_tokens
        pixels = 3 * int(size or PROBE_SIDE) ** 2 * 4  # the float32 pixels handed in
        per_patch = (layers + 4) * hidden + 2 * inner
        return pixels + patches * per_patch * element + heads * patches * patches * element

    def geometry(self, prompt_tokens: int) -> Geometry:
        text = super().geometry(prompt_tokens)
        images = math.ceil(prompt_tokens / self._image_tokens)
        return replace(text, fixed_bytes=text.fixed_bytes + images * self._vision_bytes)
