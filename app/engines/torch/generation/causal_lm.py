"""Text generation from a causal language model: a Hugging Face folder (safetensors) or a
GGUF file on the torch engine (read through transformers' GGUF loader, dequantised on
load; `vramgate pull --convert` converts a GGUF once to a folder so later loads are fast).

The dtype follows the device (bfloat16 where the GPU computes it natively, compute
capability 8.0 and later, else float16, or float32 for a model trained in bfloat16; a
model whose first forward is not finite is refused; on the CPU the faster of float32 and
bfloat16, measured at load: app.engines.torch.generation.cpu_dtype); chats use the model's own chat
template. Generation is our own step loop with a KV cache under
`torch.inference_mode()`, every stream of the model in one batch that rows join and leave
at each step (app.engines.torch.generation.step_batch), so a cancelled stream stops before
its next step and every step is counted (`forward_calls`).
"""

from __future__ import annotations

import gc
import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.gguf_facts import GgufFacts, read_gguf_facts
from app.engines.torch.generation.constrained import Grammars
from app.engines.torch.generation.cpu_dtype import fastest_on_cpu
from app.engines.torch.generation.kv_cache import plain_dynamic
from app.engines.torch.generation.packing import packing_works
from app.engines.torch.generation.step_batch import StepBatcher
from app.engines.torch.module import TorchModule
from app.errors import InvalidRequest
from app.models.base import read_chat_template, read_json_object, weight_file_bytes
from app.models.card import ModelCard
from app.models.chat.harmony import MARKERS
from app.models.chat.reasoning import (
    Frame,
    ThinkingAsk,
    answer_frame,
    harmony,
    template_switches,
)
from app.models.decoding import (
    Chat,
    DecodeResult,
    Prompt,
    SamplingParams,
    TokenStream,
    generation_prepared,
)
from app.models.kinds import Generator
from app.models.prepared import IMAGES_TAG, Prepared
from app.models.stages import InThreads
from app.models.tools import chat_messages, template_knows_tools
from app.sched.budget import Geometry

# GGUF weights are dequantised on load: a 4-bit file holds at most 2 weights a byte.
GGUF_WEIGHTS_PER_BYTE = 2
FALLBACK_CONTEXT = 4096  # a config that names no maximum


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


def auto_dtype(device: Device, requested: str, trained: str | None = None) -> str:
    """bfloat16 only where the device computes it natively: torch.cuda.is_bf16_supported()
    also says yes on Turing and Pascal, which emulate it slowly. Elsewhere float16, but a
    model `trained` in bfloat16 loads in float32: its activations overflow float16's range
    (65504; Gemma's do), and inf or NaN logits fail every batch they are in."""
    if requested != "auto":
        return requested
    if device.kind != "cuda":
        return "float32"
    if device.native_bf16():
        return "bfloat16"
    return "float32" if trained == "bfloat16" else "float16"


def trained_dtype(path: Path) -> str | None:
    """The dtype a model folder's config says its weights were trained and saved in."""
    folder, extra = source_of(path)
    if extra:  # a GGUF's tensors say nothing of how it was trained
        return None
    config = read_json_object(folder / "config.json")
    value = config.get("torch_dtype") or config.get("dtype")  # the key before transformers 5
    return str(value) if value else None


def refuse_non_finite(model: Any, device: torch.device, ids: list[int], dtype: str) -> None:
    """A model whose forward gives logits that are not finite is refused at load, saying
    why: each batch it ran would fail in sampling (multinomial raises) with a 500."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids or [0]], device=device)).logits
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(
            f"its first forward is not finite in {dtype} (the activations overflow); "
            'load it in float32 (dtype = "float32" in its entry) or on a GPU with bfloat16'
        )


class CausalLMHandler(InThreads, TorchModule, Generator):
    kind = "generation"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.path is not None, "ModelSpec checks that a generation model has a path"
        self.path = Path(spec.path)
        self.context = spec.max_context or FALLBACK_CONTEXT
        self._model: Any = None
        self._tokenizer: Any = None
        self._device = torch.device("cpu")
        self._eos: set[int] = set()
        self._hidden: set[int] | None = None  # specials left out of text, where some are kept
        self._keep_last_logits = False
        self._cache_arg = "past_key_values"

        self._kv_bytes_per_token = 0
        self._act_bytes_per_token = 0
        self._vocab = 0
        self._batcher: StepBatcher | None = None
        self._grammars: Grammars | None = None
        self._facts: GgufFacts | None = None  # a GGUF file's header, read once for its card
        self._rows_join = True  # whether streams can join its running batch (its KV cache)

    def expected_weights_bytes(self, device: Device) -> int:
        folder, extra = source_of(self.path)
        dtype = auto_dtype(device, self.spec.dtype, trained_dtype(self.path))
        element = torch.finfo(getattr(torch, dtype)).bits // 8
        if extra:  # a GGUF file, dequantised to `element`
            return self.path.stat().st_size * GGUF_WEIGHTS_PER_BYTE * element
        return weight_file_bytes(folder, element)

    def load(self, device: Device) -> None:
        self.dtype = auto_dtype(device, self.spec.dtype, trained_dtype(self.path))
        tokenizer, model = self._load_files(getattr(torch, self.dtype))
        model = model.to(torch_device_of(device)).eval()
        probe = list(tokenizer("Hello, how are you?")["input_ids"])
        if device.kind == "cpu" and self.spec.dtype == "auto":  # the faster, measured
            params = inspect.signature(model.forward).parameters
            cache_arg = "cache" if "cache" in params else "past_key_values"
            model, self.dtype = fastest_on_cpu(model, probe, cache_arg)
        refuse_non_finite(model, torch_device_of(device), probe, self.dtype)  # before it is kept
        self._tokenizer = tokenizer
        self._model = model
        self._device = torch_device_of(device)
        config = model.config.get_text_config()  # a vision-language model's text half
        own = int(getattr(config, "max_position_embeddings", 0) or 0) or FALLBACK_CONTEXT
        self.context = min(own, self.spec.max_context or own)  # the model's own by default
        self._eos = self._eos_ids(model, tokenizer)
        self._hidden = self._hidden_ids(tokenizer)
        params = inspect.signature(model.forward).parameters
        self._keep_last_logits = "logits_to_keep" in params
        # transformers renamed the KV cache argument (and output) from past_key_values.
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._estimate_sizes(config)
        joinable = self._joinable()
        self._rows_join = joinable
        packable = joinable and self._keep_last_logits
        packable = packable and packing_works(self._model, self._device, self._model.dtype)
        fast = bool(getattr(tokenizer, "is_fast", False))
        self._grammars = Grammars(tokenizer, self._vocab, self._eos) if fast else None
        self._batcher = StepBatcher(
            self._model,
            self._decode,
            self._eos,
            self._device,
            cache_arg=self._cache_arg,
            keep_last_logits=self._keep_last_logits,
            joinable=joinable,
            job_stream=device.job_stream,
            on_forward=self._count_forward,
            name=self.name,
            packable=packable,
            dtype=self._model.dtype,
            constrain=self._grammars.constraint if self._grammars else None,
            store=self.prefix_store,
            tokens=self._tag_tokens,
        )

    def _tag_tokens(self, tag: str) -> list[int]:
        """A tag's token ids (a thinking budget's open and close tags)."""
        return list(self._tokenizer(tag, add_special_tokens=False)["input_ids"])

    def _load_files(self, dtype: torch.dtype) -> tuple[Any, Any]:
        """Its tokenizer and model, read from its files (not yet on the device)."""
        return load_causal_lm(self.path, dtype)

    def _joinable(self) -> bool:
        """Whether this model's KV cache lets rows join and leave a running batch. Its
        one-token forward also primes the model (lazy allocations land in the weights
        baseline), so this handler needs no separate `prime`."""
        with torch.inference_mode():
            out = self._model(input_ids=torch.tensor([[0]], device=self._device), use_cache=True)
        return plain_dynamic(getattr(out, self._cache_arg, None))

    @property
    def cell_capacity(self) -> int | None:
        """One stream at a time where rows cannot join a running batch (a sliding-window
        cache: Gemma 2/3, Phi-3, Mistral v0.1): the others wait in the queue, where their
        deadline is the queue's, not on the device, where they would show no progress."""
        return None if self._rows_join else 1

    def _count_forward(self) -> None:
        self.forward_calls += 1  # the batch thread alone writes it; read for /status

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
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        self._model = None
        self._tokenizer = None
        self._grammars = None
        gc.collect()

    def encode(self, prompt: Prompt) -> list[int]:
        return self._encoded(prompt)[0]

    def _encoded(self, prompt: Prompt) -> tuple[list[int], Frame | None]:
        """The prompt's ids, and how a chat's answer thinks (its frame): its template is
        given the thinking switches the chat asks for (app.models.chat.reasoning)."""
        tokenizer = self._tokenizer
        if isinstance(prompt, str):
            return list(tokenizer(prompt, add_special_tokens=True)["input_ids"]), None
        if prompt.images:  # the routes refuse them first, by the model's card
            raise InvalidRequest(f"model {self.name!r} cannot see images", param="messages")
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise InvalidRequest(
                f"model {self.name!r} has no chat template; use /v1/completions",
                param="model",
            )
        knows = template_knows_tools(template)
        messages = chat_messages(prompt.messages, prompt.tools, knows)
        tools = prompt.tools if knows else None
        switches = template_switches(template, prompt.thinking)
        rendered = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **switches
        )
        budget = self.spec.thinking_budget
        text, frame = answer_frame(template, rendered, prompt.thinking, budget)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), frame

    def prepare_generation(
        self, prompt: Prompt, params: SamplingParams, default_max_tokens: int
    ) -> Prepared:
        outside = [i for i, _ in params.logit_bias if i >= self._vocab]
        if outside:
            raise InvalidRequest(
                f"logit_bias names token {outside[0]}, outside model {self.name!r}'s "
                f"vocabulary of {self._vocab}",
                param="logit_bias",
            )
        grammar = None
        if params.json_schema is not None:
            if self._grammars is None:
                raise InvalidRequest(
                    f"model {self.name!r} has no fast tokenizer: its output cannot be "
                    "constrained to a schema",
                    param="response_format",
                )
            grammar = self._grammars.compile(params.json_schema)
        if isinstance(prompt, Chat) and grammar is not None:
            prompt = replace(prompt, thinking=ThinkingAsk(on=False))  # the grammar's, whole
        ids, inputs, frame = self.encode_inputs(prompt)
        cap = default_max_tokens
        prepared = generation_prepared(self.name, ids, params, self.context, cap, grammar, frame)
        if inputs is None:
            return prepared
        payload = replace(prepared.payload, prefill_inputs=inputs)
        return replace(prepared, payload=payload, price_tag=IMAGES_TAG)

    def encode_inputs(
        self, prompt: Prompt
    ) -> tuple[list[int], dict[str, Any] | None, Frame | None]:
        """The prompt's ids, the model inputs its prefill takes beside them (None: the
        ids are all; a vision-language model's images are more) and how its answer
        thinks (None: not in tags)."""
        ids, frame = self._encoded(prompt)
        return ids, None, frame

    def generate(self, prepared: Prepared, stream: TokenStream) -> DecodeResult:
        """Run in the model's batch (on the caller's stream thread, which waits)."""
        assert self._batcher is not None, "load() first"
        bound = prepared.kv_bound[1] if prepared.kv_bound else 0
        return self._batcher.generate(prepared.payload, stream, bound)

    @property
    def batch_rows(self) -> int:
        """Streams in the running batch now."""
        return self._batcher.rows if self._batcher is not None else 0

    def _decode(self, ids: list[int]) -> str:
        if self._hidden is not None:  # harmony's markers are kept, the other specials not
            shown = [i for i in ids if i not in self._hidden]
            return str(self._tokenizer.decode(shown, skip_special_tokens=False))
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    @staticmethod
    def _hidden_ids(tokenizer: Any) -> set[int] | None:
        """The special tokens left out of the answer's text, where some are kept: a
        harmony model's (gpt-oss) markers are read (app.models.chat.harmony), as
        llama.cpp renders them; None: every special is left out."""
        if not harmony(getattr(tokenizer, "chat_template", None)):
            return None
        kept = {tokenizer.convert_tokens_to_ids(marker) for marker in MARKERS}
        added = getattr(tokenizer, "added_tokens_decoder", {})
        special = {i for i, token in added.items() if getattr(token, "special", False)}
        return (special | set(tokenizer.all_special_ids)) - kept

    def geometry(self, prompt_tokens: int) -> Geometry:
        logits = (1 if self._keep_last_logits else prompt_tokens) * self._vocab * 4
        fixed = prompt_tokens * self._act_bytes_per_token + logits
        return Geometry(self._kv_bytes_per_token, fixed)

    def card(self) -> ModelCard:
        folder, extra = source_of(self.path)
        if extra:  # a GGUF on the torch engine: its header says what it is
            self._facts = self._facts or read_gguf_facts(self.path)
            architecture, template = self._facts.architecture, self._facts.chat_template
        else:
            config = read_json_object(folder / "config.json")
            architecture = str(config.get("model_type") or self.kind)
            # the folder's own files, never through a link (the tokenizer follows them)
            template = read_chat_template(folder)
        return replace(
            super().card(),
            architecture=architecture,
            format="gguf" if extra else "safetensors",
            context_length=self.context,
            chat_template=template,
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "path": str(self.path),
            "context": self.context,
            "batch_rows": self.batch_rows,
            "packed_prefill": bool(self._batcher and self._batcher.packable),
        }
