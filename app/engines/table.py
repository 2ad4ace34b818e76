"""The handler table: which engine runs a model spec, and which handler serves it, by
(engine, kind). A new kind or engine is a row here; nothing else branches on either.

Each row imports its handler when a spec first needs it, so that the core, the routes
and the tray import no engine (and no torch) until a model of it is served."""

from __future__ import annotations

from collections.abc import Callable

from app.config.settings import ModelSpec
from app.models.base import ModelHandler
from app.models.kinds import CAPABILITIES

Bounds = tuple[int, int]  # the largest image side and pixel count accepted


def _generation(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    """A causal LM, or a vision-language model where its folder is one (it sees images)."""
    from app.engines.torch.families import sees_images

    if spec.path is not None and sees_images(spec.path):
        from app.engines.torch.generation.vision_language import VisionLanguageHandler

        return VisionLanguageHandler(spec, *bounds)
    from app.engines.torch.generation.causal_lm import CausalLMHandler

    return CausalLMHandler(spec)


def _simulated(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    """The simulated model: an image generator with an `images` setting, else the one
    that fakes every other capability."""
    from app.engines.simulated.images import SimulatedImageHandler
    from app.engines.simulated.model import SimulatedHandler

    simulated: SimulatedHandler | SimulatedImageHandler
    simulated = SimulatedImageHandler(spec) if spec.images is not None else SimulatedHandler(spec)
    simulated.max_side, simulated.max_pixels = bounds
    return simulated


def _vision(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.torch.vision import VisionHandler

    return VisionHandler(spec, *bounds)


def _rerank(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.torch.rerank import RerankHandler

    return RerankHandler(spec)


def _embedding(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.torch.embedding import EmbeddingHandler

    return EmbeddingHandler(spec)


def _diffusion(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.torch.diffusion.handler import DiffusionHandler

    return DiffusionHandler(spec, *bounds)


def _speech(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.torch.speech import SpeechHandler

    return SpeechHandler(spec)


def _speech_synthesis(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.torch.speech_synthesis import SpeechSynthesisHandler

    return SpeechSynthesisHandler(spec)


def _llama_generation(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.llama_cpp.generation import LlamaCppHandler

    return LlamaCppHandler(spec)


def _llama_embedding(spec: ModelSpec, bounds: Bounds) -> ModelHandler:
    from app.engines.llama_cpp.embedding import LlamaCppEmbedder

    return LlamaCppEmbedder(spec)


HANDLERS: dict[tuple[str, str], Callable[[ModelSpec, Bounds], ModelHandler]] = {
    ("simulated", "simulated"): _simulated,
    ("torch", "generation"): _generation,
    ("torch", "vision"): _vision,
    ("torch", "rerank"): _rerank,
    ("torch", "embedding"): _embedding,
    ("torch", "diffusion"): _diffusion,
    ("torch", "speech"): _speech,
    ("torch", "speech_synthesis"): _speech_synthesis,
    ("llama.cpp", "generation"): _llama_generation,
    ("llama.cpp", "embedding"): _llama_embedding,
}


def engine_for(spec: ModelSpec) -> str:
    """The engine that runs `spec`: its own choice, else llama.cpp for a GGUF generation
    model where xllamacpp is installed, else torch."""
    if spec.kind == "simulated":
        return "simulated"
    if spec.engine != "auto":
        return spec.engine
    gguf = spec.path is not None and spec.path.suffix.lower() == ".gguf"
    if gguf and ("llama.cpp", spec.kind) in HANDLERS:
        from app.engines.llama_cpp.runner_model import llama_cpp_available

        if llama_cpp_available():
            return "llama.cpp"
    return "torch"


def make_handler(spec: ModelSpec, image_bounds: Bounds = (4096, 2**24)) -> ModelHandler:
    """`image_bounds`: the largest image side and pixel count accepted."""
    engine = engine_for(spec)
    build = HANDLERS.get((engine, spec.kind))
    if build is None:
        raise ValueError(f"model {spec.name!r}: engine {engine} does not serve {spec.kind} models")
    handler = build(spec, image_bounds)
    if not isinstance(handler, CAPABILITIES):
        raise TypeError(f"{type(handler).__name__} fulfils no capability of app.models.kinds")
    return handler
