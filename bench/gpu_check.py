"""The CUDA check, for a session lent a GPU machine (see ../shared/gpu-check.md).

    python bench/gpu_check.py [--device cuda] [--pool-gib 4] [--out $OUT]

Runs the real server in-process on the device and prints (and writes to OUT/gpu_check.json):
1. the device: name, total memory, driver, torch and CUDA versions;
2. per bucket of a real model (a randomly initialised BERT made on the spot and saved with
   save_pretrained, so nothing has to travel): the learned price against the peak measured
   with the model run alone, and their ratio;
3. a flood at high concurrency with mixed sizes (the real model and the simulated one, which
   really allocates on the device) against a pool limited to --pool-gib by torch's
   per-process memory fraction, so the allocator itself refuses past it: OOMs (must be 0),
   rejected, served, throughput, and the peak of what torch's allocator reserved (and of
   its live tensors) against the limit;
4. a real device-side assert in a child process, and how vramgate classifies it;
5. generation (a randomly initialised Llama made on the spot): 4 concurrent chats after
   warm-up (how many ran at once, each one's price and its source), and the learned price
   of a bucket against the peak of one generation run alone to that bucket's bound;
6. llama.cpp's engine (needs xllamacpp's CUDA wheel installed there): a random Llama
   written as a GGUF, on a device limited so that its layers do not all fit; the layers
   planned against those llama.cpp logged, the bytes planned against those it logged and
   those the driver reports for the runner's pid, a chat through it, and the memory back
   after the unload;
7. a vision-language chat (a random LLaVA made on the spot): an image in an OpenAI chat on
   the device, answered twice the same (greedy), its price, bucket and price source, and
   the learned `+images` price lines against the text ones;
8. Stable Diffusion 1.5 (a pipeline at SD 1.5's real configs with random weights, made on
   the spot: memory does not depend on the values) at 512², 768² and 1024²: per size the
   price quoted first (the pipeline's geometry), the price learned from a few runs through
   `/v1/images/generations`, the isolated peak (torch.cuda.max_memory_allocated around
   the diffusers pipeline called directly at that size, the cache given back first), and
   learned / isolated (the issue's bar: within 10%);
9. speech: a Whisper at whisper-small's config (random weights), one 30-second window's
   learned price (`w30xb1`, through `/v1/audio/transcriptions`) against its isolated peak
   (`generate` on that window's features, called directly);
10. text to speech: a VITS at MMS-TTS's size (VitsConfig's defaults, random weights), one
   sentence's learned price (`sNxb1`, through `/v1/audio/speech`) against its isolated
   peak (app.engines.torch.vits.synthesize on its ids, called directly).

`--tiny` makes steps 8-10 use the tests' tiny SD 1.5-shaped pipeline, Whisper and VITS
(for a dry run: `--tiny --sd-sizes 64,128`).

On a machine without CUDA, `--device cpu` runs the same steps as a dry run. The device
machine has no network: carry the pure dependencies as wheels, e.g.
`pip download --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12
-d .whl fastapi starlette pydantic pydantic-core pydantic-settings uvicorn platformdirs
orjson annotated-types typing-inspection anyio sniffio h11 idna diffusers av
python-multipart` and install them there with `pip install --no-index --find-links .whl
...` before running this (diffusers for step 8, av and python-multipart for step 9: each
step is skipped, saying so, where what it needs cannot be imported).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GiB = 2**30
MiB = 2**20


def text(tokens: int) -> str:
    return " ".join(["a"] * max(1, tokens - 2))


def device_facts(service: Any) -> dict[str, Any]:
    import torch

    snap = service.memory.snapshot(fresh=True)
    return {
        **service.device.describe(),
        "total_bytes": snap.total,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "pool_bytes": service.memory.pool_bytes(),
    }


def limit_memory(service: Any, limit: int, cuda: Any = None) -> dict[str, Any]:
    """Let jobs hold at most `limit` bytes above the weights. On CUDA the card itself is
    limited: torch's per-process memory fraction, past which its allocator raises out of
    memory whatever the card has free (so '0 OOM' can fail from real exhaustion), and
    which the server reads as the device's limit. Without CUDA (the dry run) only the
    server's own arithmetic is: a larger reserve."""
    memory = service.memory
    memory.snapshot(fresh=True)
    if service.device.kind != "cuda":
        memory.reserve = max(0, memory.pool_bytes() + memory.reserve - limit)
        return {"how": "reserve (no CUDA: the server's arithmetic only)", "limit_bytes": limit}
    if cuda is None:
        import torch

        cuda = torch.cuda
    total = memory.snapshot(fresh=True).total
    allowed = memory.baseline + memory.reserve + limit
    fraction = min(1.0, (allowed + 1) / total)  # torch truncates fraction × total
    cuda.set_per_process_memory_fraction(fraction, service.device.index)
    memory.snapshot(fresh=True)
    return {"how": "per-process memory fraction", "fraction": fraction, "allowed_bytes": allowed}


def unlimit_memory(service: Any) -> None:
    if service.device.kind == "cuda":
        import torch

        torch.cuda.set_per_process_memory_fraction(1.0, service.device.index)


def isolated_peaks(model_dir: Path, device_spec: str, shapes: list[tuple[int, int]]) -> dict:
    """Each bucket's peak with the model alone on the device, outside the server: from a
    cache given back first, so that a CUDA peak is what the allocator had to reserve."""
    from app.config.settings import ModelSpec, load_settings
    from app.devices.choose import make_device
    from app.engines.torch.embedding import EmbeddingHandler

    device = make_device(load_settings({"device": device_spec}, Path("/nonexistent.toml")))
    handler = EmbeddingHandler(ModelSpec(name="bert", path=model_dir))
    handler.load(device)
    handler.prime()
    peaks = {}
    for tokens, batch in shapes:
        prepared = handler.preprocess([text(tokens)] * batch)
        device.synchronize()
        device.empty_cache()
        device.begin_peak()
        base = device.allocated()
        handler.forward(prepared)
        device.synchronize()
        peaks[prepared.bucket.label] = device.peak() - base
    handler.unload()
    device.empty_cache()
    return peaks


def isolated_generation_peak(model_dir: Path, device_spec: str, prompt: str, tokens: int) -> int:
    """One generation of `tokens` tokens with the model alone on the device."""
    from app.config.settings import ModelSpec, load_settings
    from app.devices.choose import make_device
    from app.engines.torch.generation.causal_lm import CausalLMHandler
    from app.models.decoding import SamplingParams, TokenStream

    device = make_device(load_settings({"device": device_spec}, Path("/nonexistent.toml")))
    handler = CausalLMHandler(ModelSpec(name="llama", kind="generation", path=model_dir))
    handler.load(device)
    handler.prime()
    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    prepared = handler.prepare_generation(prompt, params, tokens)
    device.synchronize()
    device.begin_peak()
    base = device.allocated()
    handler.generate(prepared, TokenStream(asyncio.new_event_loop()))
    device.synchronize()
    peak = device.peak() - base
    handler.unload()
    device.empty_cache()
    return peak


async def concurrent_chats(url: str, chats: int, max_tokens: int) -> dict[str, Any]:
    """`chats` streamed chats at once; how many ran together, and what each was charged."""
    import httpx

    body = {
        "model": "llama",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    headers: list[dict[str, str]] = []
    running: list[int] = []

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            headers.append({k: v for k, v in r.headers.items() if k.startswith("x-vramgate")})
            async for _ in r.aiter_lines():
                pass

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        tasks = [asyncio.ensure_future(one(client)) for _ in range(chats)]
        while not all(t.done() for t in tasks):
            running.append((await client.get("/status")).json()["queue"]["running"])
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
    return {"max_running": max(running, default=0), "admissions": headers}


def generation_check(
    work: Path, device_spec: str, tokens: int, hidden: int, layers: int
) -> dict[str, Any]:
    import httpx

    from app.config.settings import ModelSpec
    from tests.support.live import live_server, make_settings
    from tests.support.random_models import save_random_llama

    heads = max(1, hidden // 64)
    model_dir = save_random_llama(
        work / "llama",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=max(1, heads // 4),
        context=4096,
    )
    prompt = "Tell me a long story."
    report: dict[str, Any] = {}
    llama = ModelSpec(name="llama", kind="generation", path=model_dir)
    settings = make_settings(work / "gen", device=device_spec, models=(llama,))
    with live_server(settings) as live:
        with httpx.Client(base_url=live.url, timeout=600) as client:
            for max_tokens in (40, 90):  # chats that end before their bound teach the line
                client.post(
                    "/v1/completions",
                    json={"model": "llama", "prompt": prompt, "max_tokens": max_tokens},
                )
            quoted = client.post(
                "/v1/completions", json={"model": "llama", "prompt": prompt, "max_tokens": tokens}
            )
        report["concurrent"] = asyncio.run(concurrent_chats(live.url, 4, 128))
        report["lines"] = [
            p for m in live.status()["models"] if m["name"] == "llama" for p in m["prices"]
        ]
    price = int(quoted.headers["X-Vramgate-Price-Bytes"])
    bucket = quoted.headers["X-Vramgate-Bucket"]
    bound = int(bucket.split("t")[1])
    prompt_tokens = quoted.json()["usage"]["prompt_tokens"]
    peak = isolated_generation_peak(model_dir, device_spec, prompt, bound - prompt_tokens)
    report["price_vs_isolated"] = {
        "bucket": bucket,
        "price_bytes": price,
        "price_source": quoted.headers["X-Vramgate-Price-Source"],
        "isolated_peak_bytes": peak,
        "ratio": round(price / peak, 3) if peak else None,
    }
    return report


def vision_language_check(work: Path, device_spec: str) -> dict[str, Any]:
    """A chat with an image on the device: what it was priced and what it learned."""
    import base64
    import io

    import httpx
    from PIL import Image

    from app.config.settings import ModelSpec
    from tests.support.live import live_server, make_settings
    from tests.support.random_models import save_random_llava

    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 90)).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}]
    body = {"model": "vl", "messages": [{"role": "user", "content": parts}], "max_tokens": 32}
    vl = ModelSpec(name="vl", kind="generation", path=save_random_llava(work / "llava"))
    settings = make_settings(work / "vl", device=device_spec, models=(vl,))
    with live_server(settings) as live, httpx.Client(base_url=live.url, timeout=600) as client:
        answers = [client.post("/v1/chat/completions", json={**body, "temperature": 0})]
        answers.append(client.post("/v1/chat/completions", json={**body, "temperature": 0}))
        lines = [p for m in live.status()["models"] if m["name"] == "vl" for p in m["prices"]]
    first = answers[0]
    return {
        "status": [a.status_code for a in answers],
        "same_answer": first.json()["choices"][0]["message"]["content"]
        == answers[1].json()["choices"][0]["message"]["content"],
        "usage": first.json()["usage"],
        "bucket": first.headers.get("X-Vramgate-Bucket"),
        "price_bytes": first.headers.get("X-Vramgate-Price-Bytes"),
        "price_source": first.headers.get("X-Vramgate-Price-Source"),
        "lines": lines,
    }


# -- 8: Stable Diffusion 1.5 by size ------------------------------------------------------
SD15_TEXT = {  # SD 1.5's text encoder: CLIP ViT-L/14's
    "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072,
    "num_hidden_layers": 12, "num_attention_heads": 12, "max_position_embeddings": 77,
    "projection_dim": 768, "hidden_act": "quick_gelu",
}  # fmt: skip
WHISPER_SMALL = {  # openai/whisper-small's config.json (the vocabulary's size included)
    "vocab_size": 51865, "d_model": 768, "encoder_layers": 12, "decoder_layers": 12,
    "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
    "decoder_ffn_dim": 3072, "num_mel_bins": 80, "max_source_positions": 1500,
    "max_target_positions": 448, "init_std": 0.02,
}  # fmt: skip


def save_sd15(folder: Path, tiny: bool) -> Path:
    """A pipeline at SD 1.5's configs (UNet 320/640/1280/1280 with 768-wide cross
    attention, VAE 128/256/512/512, CLIP ViT-L/14's text encoder), random weights saved in
    float16, the tests' byte-level tokenizer; or, `tiny`, the tests' tiny one."""
    import torch
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    from tests.support.random_models import _clip_tokenizer, save_random_sd15

    if tiny:
        return save_random_sd15(folder)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(sample_size=64, cross_attention_dim=768)  # else SD 1.5's
    vae = AutoencoderKL(
        block_out_channels=[128, 256, 512, 512], down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2, latent_channels=4,
        sample_size=512,
    )  # fmt: skip
    text = CLIPTextConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, **SD15_TEXT)
    scheduler = PNDMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True,
        steps_offset=1, set_alpha_to_one=False,
    )  # fmt: skip
    pipeline = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=CLIPTextModel(text), tokenizer=_clip_tokenizer(),
        scheduler=scheduler, safety_checker=None, feature_extractor=None,
        requires_safety_checker=False,
    )  # fmt: skip
    pipeline.to(torch.float16).save_pretrained(folder)
    return folder


def give_back_cache() -> None:
    """What a direct call left cached goes back before the server starts beside it."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measured_peak(device: Any, call: Any) -> dict[str, int]:
    """`call()`'s peak from a cache given back first: the device's own rule (what the
    server measures), and on CUDA torch.cuda.max_memory_allocated's growth alone."""
    device.synchronize()
    device.empty_cache()
    device.begin_peak()  # on CUDA: reset_peak_memory_stats
    base = device.allocated()
    call()
    device.synchronize()
    peak = {"peak_bytes": device.peak() - base}
    if device.kind == "cuda":
        import torch

        peak["max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device.index)) - base
    return peak


def image_body(side: int, steps: int, seed: int) -> dict[str, Any]:
    return {
        "model": "sd15", "prompt": "a lighthouse at dusk", "n": 1, "size": f"{side}x{side}",
        "seed": seed, "steps": steps,
    }  # fmt: skip


def isolated_diffusion_peaks(
    folder: Path, device_spec: str, sides: list[int], steps: int
) -> dict[int, dict[str, int]]:
    """Each size's peak with the diffusers pipeline called directly, alone on the device,
    as the server calls it (batch 1, guidance, a CPU generator, numpy output)."""
    import torch
    from diffusers import AutoPipelineForText2Image

    from app.config.settings import load_settings
    from app.devices.choose import make_device
    from app.models.base import dtype_on

    device = make_device(load_settings({"device": device_spec}, Path("/nonexistent.toml")))
    dtype = getattr(torch, dtype_on(device, "auto"))
    pipeline = AutoPipelineForText2Image.from_pretrained(
        folder, dtype=dtype, use_safetensors=True, local_files_only=True
    ).to(device.torch_device)
    pipeline.set_progress_bar_config(disable=True)

    def run(side: int, run_steps: int) -> None:
        with torch.inference_mode():
            pipeline(
                prompt=["a lighthouse at dusk"], width=side, height=side, output_type="np",
                num_inference_steps=run_steps, generator=[torch.Generator().manual_seed(0)],
            )  # fmt: skip

    run(min(sides), 1)  # kernels and handles loaded once, as the server's priming does
    return {side: measured_peak(device, lambda side=side: run(side, steps)) for side in sides}


def diffusion_check(
    work: Path, device_spec: str, sides: list[int], steps: int, tiny: bool, runs: int = 3
) -> dict[str, Any]:
    """Per size: the first quote, the learned price after `runs` runs, the isolated peak."""
    import importlib.util

    import httpx

    from app.config.settings import ModelSpec
    from tests.support.live import live_server, make_settings

    if importlib.util.find_spec("diffusers") is None:
        return {"skipped": "diffusers is not installed here"}
    folder = save_sd15(work / "sd15", tiny)
    isolated = isolated_diffusion_peaks(folder, device_spec, sides, steps)
    give_back_cache()
    spec = ModelSpec(name="sd15", kind="diffusion", path=folder, max_batch=1, load="startup")
    settings = make_settings(work / "sd", device=device_spec, models=(spec,))
    first: dict[int, httpx.Response] = {}
    with live_server(settings) as live, httpx.Client(base_url=live.url, timeout=600) as client:
        for side in sides:
            for seed in range(runs):  # one after another: each runs alone, measured clean
                answer = client.post("/v1/images/generations", json=image_body(side, steps, seed))
                answer.raise_for_status()
                first.setdefault(side, answer)
        lines = bucket_prices(live.status(), "sd15")
    rows = [_size_row(side, first[side], lines, isolated[side]) for side in sides]
    return {
        "sizes": rows,
        "steps": steps,
        "configs": "tiny (the tests')" if tiny else "SD 1.5's, random weights, float16 saved",
        "all_within_10pct": all(row["within_10pct"] for row in rows),
    }


def bucket_prices(status: dict[str, Any], model: str) -> dict[str, Any]:
    """The model's price lines in the server's /status, by bucket."""
    return {p["bucket"]: p for m in status["models"] if m["name"] == model for p in m["prices"]}


def _size_row(
    side: int, answer: Any, lines: dict[str, Any], isolated: dict[str, int]
) -> dict[str, Any]:
    bucket = answer.headers["X-Vramgate-Bucket"]
    line = lines.get(bucket, {})
    learned = line.get("price_bytes")
    reference = isolated.get("max_allocated_bytes", isolated["peak_bytes"])
    ratio = round(learned / reference, 3) if learned and reference > 0 else None
    return {
        "size": f"{side}x{side}",
        "bucket": bucket,
        "first_quote_bytes": int(answer.headers["X-Vramgate-Price-Bytes"]),
        "first_quote_source": answer.headers["X-Vramgate-Price-Source"],
        "learned_bytes": learned,
        "samples": line.get("samples"),
        "isolated_max_allocated_bytes": isolated.get("max_allocated_bytes"),
        "isolated_peak_bytes": isolated["peak_bytes"],  # the device's rule: reserved growth too
        "ratio": ratio,
        "within_10pct": ratio is not None and abs(ratio - 1) <= 0.10,
    }


# -- 9: one speech window ------------------------------------------------------------------
def save_whisper(folder: Path, tiny: bool) -> Path:
    """A Whisper at whisper-small's config with random weights (its processor and
    generation config the tests' small ones: token ids past that tokenizer decode as
    timestamps, which the server keeps within the window); or, `tiny`, the tests' own."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    from tests.support.random_whisper import save_random_whisper

    save_random_whisper(folder, d_model=64, layers=1)
    if tiny:
        return folder
    config = WhisperConfig.from_pretrained(folder)
    for name, value in WHISPER_SMALL.items():
        setattr(config, name, value)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config)
    with torch.no_grad():  # as the tests' Whisper: end-of-text lowered, so it writes a while
        model.proj_out.weight[config.eos_token_id].mul_(0.0)
    model.generation_config = GenerationConfig.from_pretrained(folder)
    model.save_pretrained(folder)
    return folder


def isolated_window_peak(folder: Path, device_spec: str, samples: Any) -> dict[str, int]:
    """One 30-second window's `generate`, called directly as the server calls it."""
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    from app.config.settings import load_settings
    from app.devices.choose import make_device
    from app.models.base import dtype_on

    device = make_device(load_settings({"device": device_spec}, Path("/nonexistent.toml")))
    dtype = getattr(torch, dtype_on(device, "auto"))
    model = WhisperForConditionalGeneration.from_pretrained(folder, dtype=dtype)
    model = model.to(device.torch_device).eval()
    features = (
        WhisperProcessor.from_pretrained(folder)
        .feature_extractor([samples], sampling_rate=16_000, return_tensors="pt")
        .input_features.to(device.torch_device, dtype)
    )
    kwargs = {"return_timestamps": True, "task": "transcribe", "language": "en"}

    def run() -> None:
        with torch.inference_mode():
            model.generate(features, **kwargs)

    run()  # kernels and handles loaded once, as the server's priming does
    return measured_peak(device, run)


def speech_check(work: Path, device_spec: str, tiny: bool, runs: int = 3) -> dict[str, Any]:
    import importlib.util

    import httpx

    from app.config.settings import ModelSpec
    from tests.support.live import live_server, make_settings
    from tests.support.random_whisper import tone, write_wav

    missing = [m for m in ("av", "multipart") if importlib.util.find_spec(m) is None]
    if missing:
        return {"skipped": f"{', '.join(missing)} not installed here"}
    folder = save_whisper(work / "whisper", tiny)
    from app.models.audio import decode_audio

    wav = write_wav(work / "window.wav", tone(30.0, seed=3)).read_bytes()
    isolated = isolated_window_peak(folder, device_spec, decode_audio(wav, 60.0))
    give_back_cache()
    spec = ModelSpec(name="whisper", kind="speech", path=folder, max_batch=8, load="startup")
    settings = make_settings(work / "speech", device=device_spec, models=(spec,))
    form = {"model": "whisper", "language": "en", "response_format": "json"}
    with live_server(settings) as live, httpx.Client(base_url=live.url, timeout=600) as client:
        answers = [
            client.post("/v1/audio/transcriptions", files={"file": ("w.wav", wav)}, data=form)
            for _ in range(runs)
        ]
        lines = bucket_prices(live.status(), "whisper")
    first = answers[0]
    bucket = first.headers.get("X-Vramgate-Bucket", "")
    row = _size_row(30, first, lines, isolated) if first.status_code == 200 else {}
    row.pop("size", None)
    return {
        "status": [a.status_code for a in answers],
        "config": "the tests' tiny Whisper" if tiny else "whisper-small's, random weights",
        "window": "30 s",
        **row,
        "bucket": bucket,
    }


# -- 10: one spoken sentence -------------------------------------------------------------
SENTENCE = "The quick brown fox jumps over the lazy dog while the band plays on."


def isolated_sentence_peak(folder: Path, device_spec: str) -> dict[str, int]:
    """The sentence's forward, called directly as the server calls it (its tokenizer's
    ids, speaker 0, speed 1, the request's default seed 0)."""
    import torch
    from transformers import VitsModel, VitsTokenizer

    from app.config.settings import load_settings
    from app.devices.choose import make_device
    from app.engines.torch.vits import Row, synthesize

    device = make_device(load_settings({"device": device_spec}, Path("/nonexistent.toml")))
    model = VitsModel.from_pretrained(folder, dtype=torch.float32).to(device.torch_device)
    model = model.eval()
    ids = VitsTokenizer.from_pretrained(folder)(SENTENCE).input_ids

    def run() -> None:
        with torch.inference_mode():
            synthesize(model, [Row(ids, 0, 1.0, 0)])

    run()  # kernels and handles loaded once, as the server's priming does
    return measured_peak(device, run)


def speech_synthesis_check(work: Path, device_spec: str, tiny: bool, runs: int = 3) -> dict:
    """A VITS at MMS-TTS's size (random weights; `tiny`: the tests' own): one sentence's
    learned price through /v1/audio/speech against its isolated peak."""
    import httpx

    from app.config.settings import ModelSpec
    from tests.support.live import live_server, make_settings
    from tests.support.random_vits import save_random_vits

    folder = save_random_vits(work / "vits", mms_size=not tiny)
    isolated = isolated_sentence_peak(folder, device_spec)
    give_back_cache()
    spec = ModelSpec(name="vits", kind="speech_synthesis", path=folder, load="startup")
    settings = make_settings(work / "tts", device=device_spec, models=(spec,))
    body = {"model": "vits", "input": SENTENCE, "response_format": "pcm"}
    with live_server(settings) as live, httpx.Client(base_url=live.url, timeout=600) as client:
        answers = [client.post("/v1/audio/speech", json=body) for _ in range(runs)]
        lines = bucket_prices(live.status(), "vits")
    first = answers[0]
    row = _size_row(0, first, lines, isolated) if first.status_code == 200 else {}
    row.pop("size", None)
    return {
        "status": [a.status_code for a in answers],
        "config": "the tests' tiny VITS" if tiny else "MMS-TTS's (VitsConfig defaults), random",
        "sentence": SENTENCE,
        # OpenAI's pcm: 24 kHz, 16-bit, mono
        "audio_seconds": len(first.content) / 2 / 24_000 if first.status_code == 200 else 0,
        **row,
    }


async def flood(url: str, bodies: list[dict], clients: int) -> dict[str, Any]:
    import httpx

    queue: asyncio.Queue[dict] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    codes: dict[int, int] = {}
    async with httpx.AsyncClient(
        base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients)
    ) as client:

        async def worker() -> None:
            while not queue.empty():
                response = await client.post("/v1/embeddings", json=queue.get_nowait())
                codes[response.status_code] = codes.get(response.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return {"codes": codes, "seconds": time.perf_counter() - started}


def device_side_assert(device_spec: str) -> dict[str, Any]:
    """A real device-side assert (an out-of-range index in a kernel) in a child process,
    and how vramgate's device classifies the exception it raises."""
    if not device_spec.startswith("cuda"):
        return {"skipped": "needs CUDA"}
    code = (
        "import torch, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from app.devices.cuda import CudaDevice\n"
        "device = CudaDevice(0)\n"
        "x = torch.zeros(4, device='cuda')\n"
        "try:\n"
        "    x[torch.tensor([99], device='cuda')] = 1.0\n"
        "    torch.cuda.synchronize()\n"
        "    print('no error raised')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, '|', str(exc).splitlines()[0])\n"
        "    print('fatal' if device.is_fatal(exc) else 'not fatal')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return {"stdout": done.stdout.strip().splitlines(), "exit": done.returncode}


def llama_split_check(work: Path, device_spec: str, layers: int = 16) -> dict[str, Any]:
    """A GGUF larger than the room it is given: the split, planned and as it happened."""
    from app.config.settings import ModelSpec
    from app.engines.llama_cpp.generation import LlamaCppHandler
    from app.engines.llama_cpp.layer_split import bytes_on_device
    from app.engines.llama_cpp.runner_model import llama_cpp_available
    from tests.support.live import live_server, make_settings
    from tests.support.random_models import save_random_llama, save_random_llama_gguf

    if not llama_cpp_available():
        return {"skipped": "xllamacpp is not installed here"}
    folder = save_random_llama(work / "split-llama", hidden=1024, layers=layers, heads=16,
                               kv_heads=8, context=8192)  # fmt: skip
    gguf = save_random_llama_gguf(folder, work / "split-llama.gguf")
    spec = ModelSpec(name="split", kind="generation", path=gguf, context_length=8192,
                     parallel=4, load="startup")  # fmt: skip
    facts = LlamaCppHandler(spec).facts()
    whole = bytes_on_device(facts, facts.layers, "f16", 8192 * 4)
    probe = make_settings(work / "probe", device=device_spec)
    with live_server(probe, ready=False) as live:
        before = live.service.memory.snapshot(fresh=True)
    room = whole * 6 // 10  # room for about 60% of it (a CPU takes it whole, in RAM)
    reserve = max(0, before.total - room) if not device_spec.startswith("cpu") else None
    settings = make_settings(
        work / "split", device=device_spec, models=(spec,), headroom=0, reserve=reserve
    )
    with live_server(settings) as live:
        row = next(m for m in live.status()["models"] if m["name"] == "split")
        handler = live.service.registry.entries["split"].handler
        assert isinstance(handler, LlamaCppHandler)
        logged = handler.footprint()
        snap = live.service.memory.snapshot(fresh=True)
        chat = __import__("httpx").post(live.url + "/v1/chat/completions", timeout=120, json={
            "model": "split", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        })  # fmt: skip
        pid = handler.runner_pid
        split = handler.split
        report = {
            "whole_bytes": whole,
            "room_bytes": room,
            "planned_layers": split.on_device if split else None,
            "logged_layers": f"{logged.layers_on_device}/{logged.layers}",
            "split": row.get("split"),
            "planned_device_bytes": split.device_bytes if split else None,
            "logged_device_bytes": logged.device_bytes,
            "logged_device": logged.device,
            "ours_bytes_by_driver_or_log": snap.ours,
            "chat_status": chat.status_code,
            "runner_pid": pid,
        }
        unloaded = __import__("httpx").post(live.url + "/admin/models/split/unload", timeout=60)
        report["unload_status"] = unloaded.status_code
        after = live.service.memory.snapshot(fresh=True)
        report["used_after_unload_minus_before"] = (after.total - after.free) - (
            before.total - before.free
        )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--pool-gib", type=float, default=4.0)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--gen-tokens", type=int, default=1000, help="a priced generation")
    parser.add_argument("--sd-sizes", default="512,768,1024", help="SD 1.5's image sides")
    parser.add_argument("--sd-steps", type=int, default=4, help="a peak is one step's")
    parser.add_argument("--tiny", action="store_true", help="steps 8 and 9 on tiny models")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()

    import torch

    from app.config.settings import ModelSpec, SimulatedBucket
    from tests.support.live import live_server, make_settings
    from tests.support.random_models import save_random_bert

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    model_dir = save_random_bert(
        work / "bert", hidden=args.hidden, layers=args.layers, heads=args.hidden // 64, max_seq=512
    )
    shapes = [(16, 1), (64, 8), (128, 32), (256, 32), (512, 16)]
    report: dict[str, Any] = {"isolated_peaks": isolated_peaks(model_dir, args.device, shapes)}

    limit = int(args.pool_gib * GiB)
    sim = ModelSpec(
        name="sim",
        kind="simulated",
        buckets=(  # sized to the limited pool
            SimulatedBucket(size=16, bytes=limit // 16, run_ms=20),
            SimulatedBucket(size=64, bytes=limit // 4, run_ms=60),
            SimulatedBucket(size=256, bytes=limit * 5 // 8, run_ms=120),
        ),
    )
    bert = ModelSpec(name="bert", path=model_dir, max_batch=32)
    settings = make_settings(
        work, device=args.device, models=(bert, sim), max_queue=10_000, queue_timeout=600
    )
    with live_server(settings) as live:
        service = live.service
        snap = service.memory.snapshot(fresh=True)
        report["limit"] = limit_memory(service, limit)
        report["device"] = device_facts(service)
        import httpx

        for tokens, batch in shapes:  # teach the book the same buckets
            httpx.post(
                live.url + "/v1/embeddings",
                timeout=300,
                json={"model": "bert", "input": [text(tokens)] * batch},
            )
        prices = {
            p["bucket"]: p["price_bytes"]
            for m in live.status()["models"]
            if m["name"] == "bert"
            for p in m["prices"]
        }
        report["buckets"] = [
            {
                "bucket": b,
                "learned": prices.get(b),
                "isolated": peak,
                "ratio": round(prices[b] / peak, 3) if prices.get(b) and peak else None,
            }
            for b, peak in report["isolated_peaks"].items()
        ]
        on_cuda = args.device.startswith("cuda")
        if on_cuda:
            torch.cuda.reset_peak_memory_stats()
        base = service.device.allocated()
        rng = __import__("random").Random(7)
        bodies = []
        for _ in range(args.requests):
            if rng.random() < 0.5:
                tokens, batch = rng.choice(shapes)
                bodies.append({"model": "bert", "input": [text(tokens)] * batch})
            else:
                bodies.append({"model": "sim", "input": text(rng.choice([10, 50, 200]))})
        result = asyncio.run(flood(live.url, bodies, args.clients))
        status = live.status()
        # what fails a job is the allocator's reserved segments, not its live tensors
        reserved = torch.cuda.max_memory_reserved() - base if on_cuda else None  # not on CPU
        allocated = torch.cuda.max_memory_allocated() - base if on_cuda else None
        unlimit_memory(service)
        report["flood"] = {
            **result,
            "requests_per_s": round(args.requests / result["seconds"], 1),
            "ooms": status["counters"]["ooms"],
            "rejected": status["counters"]["rejected"],
            "served": status["counters"]["served"],
            "pool_limit_bytes": limit,
            "peak_reserved_above_weights": reserved,
            "peak_allocated_above_weights": allocated,
            "snapshot_total": snap.total,
        }
    report["device_side_assert"] = device_side_assert(args.device)
    report["generation"] = generation_check(
        work, args.device, args.gen_tokens, args.hidden, args.layers
    )
    report["llama_split"] = llama_split_check(work, args.device)
    report["vision_language"] = vision_language_check(work, args.device)
    sides = [int(side) for side in args.sd_sizes.split(",")]
    report["sd15"] = diffusion_check(work, args.device, sides, args.sd_steps, args.tiny)
    report["speech_window"] = speech_check(work, args.device, args.tiny)
    report["speech_synthesis"] = speech_synthesis_check(work, args.device, args.tiny)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report, indent=2, default=str))
    return 0 if report["flood"]["ooms"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
