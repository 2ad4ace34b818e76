"""Text generation from a causal language model: a Hugging Face folder (safetensors) or a
GGUF file (read through transformers' GGUF loader, dequantised on load; `vramgate pull`
converts a GGUF once to a folder so later loads are fast).

The dtype follows the device (bfloat16 where the GPU computes it natively, compute
capability 8.0 and later, else float16; float32 on the CPU); chats
use the model's own chat template. Generation is our own step loop with a KV cache under
`torch.inference_mode()`, so a cancelled stream stops before its next forward step and
every step is counted (`forward_calls`).

Bucket: (prompt tokens, prompt + max_tokens), each rounded up (app.models.decoding). The
price is a line (app.sched.budget): KV bytes per token × the token bound + the prefill's
activations; before measurements, both come from the config (`geometry`), and every
finished generation reports its own KV cache's bytes (`cache_bytes`).
"""

from __future__ import annotations

import gc
import inspect
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.engine.device import Device
from app.errors import InvalidRequest
from app.models.base import Prepared, weight_file_bytes
from app.models.decoding import (
    DecodeResult,
    GenerationInput,
    Prompt,
    SamplingParams,
    StopScanner,
    TokenStream,
    generation_prepared,
)
from app.models.kinds import Generator
from app.sched.budget import Geometry
from app.settings import ModelSpec

# GGUF weights are dequantised on load: a 4-bit file holds at most 2 weights a byte.
GGUF_WEIGHTS_PER_BYTE = 2


def source_of(path: Path) -> tuple[Path, dict[str, str]]:
    """The folder to load from, and the GGUF file inside it if `path` is one."""
    if path.suffix.lower() == ".gguf":
        return path.parent, {"gguf_file": path.name}
    return path, {}


def load_causal_lm(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    """Tokenizer and model from a folder or a GGUF file, offline."""
    folder, extra = source_of(path)
    if not folder.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **extra)
    safe = {} if extra else {"use_safetensors": True}  # never unpickle weights
    model = AutoModelForCausalLM.from_pretrained(
        folder, local_files_only=True, dtype=dtype, **extra, **safe
    )

    return tokenizer, model


def auto_dtype(device: Device, requested: str) -> str:
    """bfloat16 only where the device computes it natively: torch.cuda.is_bf16_supported()
    also says yes on Turing and Pascal, which emulate it slowly."""
    if requested != "auto":
        return requested
    if device.kind != "cuda":
        return "float32"
    return "bfloat16" if device.native_bf16() else "float16"


def cache_bytes(cache: Any) -> int:
    """The bytes of a KV cache's own tensors: a transformers Cache (its `layers`' keys
    and values, or the older `key_cache`/`value_cache` lists) or legacy tuples."""
    seen: set[int] = set()

    def visit(item: Any, depth: int) -> int:
        if isinstance(item, torch.Tensor):
            if id(item) in seen:
                return 0
            seen.add(id(item))
            return item.numel() * item.element_size()
        if isinstance(item, list | tuple):
            return sum(visit(part, depth) for part in item)
        if depth < 3 and hasattr(item, "__dict__"):
            return sum(visit(value, depth + 1) for value in vars(item).values())
        return 0

    return visit(cache, 0)


class CausalLMHandler(Generator):
    kind = "generation"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a generation model has a path"
        self.path = Path(spec.path)
        self.context = spec.max_context
        self._model: Any = None
        self._tokenizer: Any = None
        self._device = torch.device("cpu")
        self._eos: set[int] = set()
        self._keep_last_logits = False
        self._cache_arg = "past_key_values"

        self._kv_bytes_per_token = 0
        self._act_bytes_per_token = 0
        self._vocab = 0

    def expected_weights_bytes(self, device: Device) -> int:
        folder, extra = source_of(self.path)
        element = torch.finfo(getattr(torch, auto_dtype(device, self.spec.dtype))).bits // 8
        if extra:  # a GGUF file, dequantised to `element`
            return self.path.stat().st_size * GGUF_WEIGHTS_PER_BYTE * element
        return weight_file_bytes(folder, element)

    def load(self, device: Device) -> None:
        self.dtype = auto_dtype(device, self.spec.dtype)
        tokenizer, model = load_causal_lm(self.path, getattr(torch, self.dtype))
        self._tokenizer = tokenizer
        self._model = model.to(device.torch_device).eval()
        self._device = device.torch_device
        config = model.config
        positions = int(getattr(config, "max_position_embeddings", 0) or self.spec.max_context)
        self.context = min(positions, self.spec.max_context)
        self._eos = self._eos_ids(model, tokenizer)
        params = inspect.signature(model.forward).parameters
        self._keep_last_logits = "logits_to_keep" in params
        # transformers renamed the KV cache argument (and output) from past_key_values.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

        self._estimate_sizes(config)

    @staticmethod
    def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(model, "generation_config", None), model.config, tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return ids

    def _estimate_sizes(self, config: Any) -> None:
        element = torch.finfo(getattr(torch, self.dtype)).bits // 8
        hidden = int(getattr(config, "hidden_size", 0) or 0)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        heads = int(getattr(config, "num_attention_heads", 1) or 1)
        kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
        head_dim = int(getattr(config, "head_dim", 0) or hidden // heads)
        inner = int(getattr(config, "intermediate_size", 4 * hidden) or 4 * hidden)
        self._kv_bytes_per_token = 2 * layers * kv_heads * head_dim * element
        self._act_bytes_per_token = (4 * hidden + 2 * inner) * element
        self._vocab = int(getattr(config, "vocab_size", 0) or 0)

    def torch_module(self) -> Any:
        return self._model

    def unload(self) -> None:
        self._model = None
        self._tokenizer = None
        gc.collect()

    def encode(self, prompt: Prompt) -> list[int]:
        tokenizer = self._tokenizer
        if isinstance(prompt, str):
            return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidRequest(
                f"model {self.name!r} has no chat template; use /v1/completions",
                param="model",
            )
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def prepare_generation(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        ids = self.encode(prompt)
        return generation_prepared(self.name, ids, params, self.context, default_max_tokens)

    def generate(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        task: GenerationInput = prepared.payload
        params = task.params
        sampler = torch.Generator()
        if params.seed is not None:
            sampler.manual_seed(params.seed)
        else:
            sampler.seed()
        scanner = StopScanner(params.stop)
        produced: list[int] = []
        steps, finish = 0, "length"
        step_ids = torch.tensor([task.prompt_ids], device=self._device)
        extra: dict[str, Any] = {"logits_to_keep": 1} if self._keep_last_logits else {}

        cache: Any = None
        with torch.inference_mode():
            for _ in range(task.max_tokens):
                if stream.cancelled.is_set():
                    finish = "cancelled"
                    break
                out = self._model(input_ids=step_ids, use_cache=True, **extra)
                steps += 1
                self.forward_calls += 1  # one inference thread per job; read for /status
                extra[self._cache_arg] = getattr(out, self._cache_arg)

                cache = extra[self._cache_arg]
                token = sample(out.logits[0, -1], params, sampler)
                if token in self._eos:
                    finish = "stop"
                    break
                produced.append(token)
                stream.emit(scanner.push(self._decode(produced)))
                if scanner.stopped:
                    finish = "stop"
                    break
                step_ids = torch.tensor([[token]], device=self._device)
        if not scanner.stopped:
            stream.emit(scanner.push(self._decode(produced), final=True))
        held = len(task.prompt_ids) + max(0, steps - 1) if steps else 0  # the last token
        return DecodeResult(  # sampled is never fed back
            scanner.text,
            len(task.prompt_ids),
            len(produced),
            finish,
            steps,
            kv_tokens=held,
            kv_bytes=cache_bytes(cache) if cache is not None else 0,
        )

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def prime(self) -> None:
        with torch.inference_mode():
            self._model(input_ids=torch.tensor([[0]], device=self._device))

    def geometry(self, prompt_tokens: int) -> Geometry:
        logits = (1 if self._keep_last_logits else prompt_tokens) * self._vocab * 4
        fixed = prompt_tokens * self._act_bytes_per_token + logits
        return Geometry(self._kv_bytes_per_token, fixed)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.path), "context": self.context}


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Greedy at temperature 0; otherwise temperature, then nucleus (top_p) sampling."""
    logits = logits.float().cpu()
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        ordered, index = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < params.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, index[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
