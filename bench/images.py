"""Image generation benchmark on the CPU, side by side in one run:

    python bench/images.py [--side 128] [--steps 25] [--channels 64] [--rounds 3]
                           [--write-readme]

A random Stable Diffusion 1.5-shaped pipeline of mid size (built here with diffusers'
classes and save_pretrained: a UNet of SD 1.5's layout, three cross-attention levels and
one plain, two resnets a level, `--channels` × 1/2/4/4 wide; a KL VAE of SD's four
levels, latents 1/8 a side; a small CLIP text encoder; PNDM as SD 1.5 ships) makes four
`--side`² images of `--steps` steps with classifier-free guidance:

- the diffusers pipeline called directly in this process: the four prompts as one batch,
  and one call per prompt (batch 1 × 4);
- a real `vramgate serve` child process on loopback (`kind = "diffusion"`, max_batch 4)
  through `POST /v1/images/generations`: four requests sent at once (they should run as
  one batch: `X-Vramgate-Batch` 4), and the same four one after the other.

Each pair alternates for `--rounds` rounds; a row shows its best round and all of them
(this machine is shared: other work slows single rounds by several times). Each image
has its own prompt and seed, the same in every run; the batched images are compared with
the direct batch's. The server and this process each use `--threads` torch threads, and
never run at the same time.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.run import start_vramgate, write_readme  # noqa: E402
from tests.support.random_models import _clip_text_config, _clip_tokenizer  # noqa: E402

IMAGES = 4
MODEL = "sd"
PROMPTS = [
    f"a lighthouse at dusk, seen from the {side}" for side in ("north", "east", "south", "west")
]
SEEDS = [11, 22, 33, 44]
# How long a request that could run at once waits for others to join its batch: the four
# sent at once arrive within a few ms; each of the four sent in turn waits it out alone.
WAIT_MS = 100


@dataclass
class Row:
    name: str
    rounds: list[tuple[float, float]]  # per round: wall and CPU seconds for the four images
    note: str = ""
    queued: list[float] | None = None  # per round: the four's seconds in the server's queue

    @property
    def best(self) -> tuple[float, float]:
        """The round with the least wall time (CPU seconds: that round's)."""
        return min(self.rounds)


@dataclass
class Result:
    rows: list[Row]  # the direct calls (batch 4, 1 × 4), then the server's (at once, in turn)
    difference: int  # the largest pixel difference, batched through vramgate against direct
    unet_parameters: int


def save_pipeline(folder: Path, channels: int, side: int) -> int:
    """A random SD 1.5-shaped pipeline, `channels` wide at the UNet's first level (SD 1.5:
    320), native size `side`, saved with diffusers' save_pretrained."""
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextModel

    torch.manual_seed(0)
    text = 128
    unet = UNet2DConditionModel(
        sample_size=side // 8, in_channels=4, out_channels=4, layers_per_block=2,
        block_out_channels=(channels, 2 * channels, 4 * channels, 4 * channels),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=text, attention_head_dim=8, norm_num_groups=32,
    )  # fmt: skip
    vae = AutoencoderKL(
        block_out_channels=[channels // 2, channels, channels, channels], in_channels=3,
        out_channels=3, latent_channels=4, down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, layers_per_block=2, norm_num_groups=32,
        sample_size=side,
    )  # fmt: skip
    scheduler = PNDMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", skip_prk_steps=True,
        steps_offset=1, set_alpha_to_one=False,
    )  # fmt: skip
    pipeline = StableDiffusionPipeline(
        unet=unet, vae=vae, text_encoder=CLIPTextModel(_clip_text_config(text)),
        tokenizer=_clip_tokenizer(), scheduler=scheduler, safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )  # fmt: skip
    pipeline.save_pretrained(folder)
    return sum(p.numel() for p in unet.parameters())


def timed(work: Callable[[], Any], cpu: Callable[[], float]) -> tuple[float, float, Any]:
    """Wall seconds, seconds of `cpu` (a process's CPU time) and the result of `work`."""
    started, cpu_started = time.perf_counter(), cpu()
    result = work()
    return time.perf_counter() - started, cpu() - cpu_started, result


@dataclass
class Rounds:
    """One kind of run repeated: (wall, CPU) seconds and the result of each round."""

    times: list[tuple[float, float]]
    results: list[Any]


def alternate(
    first: Callable[[], Any], second: Callable[[], Any], cpu: Callable[[], float], rounds: int
) -> tuple[Rounds, Rounds]:
    """`first` then `second`, `rounds` times."""
    kept = (Rounds([], []), Rounds([], []))
    for _ in range(rounds):
        for work, record in zip((first, second), kept, strict=True):
            wall, spent, result = timed(work, cpu)
            record.times.append((wall, spent))
            record.results.append(result)
    return kept


# -- the pipeline called directly ------------------------------------------------------
def direct_runs(folder: Path, args: argparse.Namespace) -> tuple[list[Row], np.ndarray]:
    """Batch 4 against batch 1 × 4; the batch's images (uint8, as the server encodes them)."""
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(folder, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)

    def run(indices: list[int], steps: int = args.steps) -> np.ndarray:
        with torch.inference_mode():
            images = pipeline(
                prompt=[PROMPTS[i] for i in indices],
                generator=[torch.Generator().manual_seed(SEEDS[i]) for i in indices],
                width=args.side, height=args.side, num_inference_steps=steps,
                output_type="np",
            ).images  # fmt: skip
        return (images * 255).round().astype(np.uint8)

    run([0], 1)  # warm-up: both shapes' buffers, one step each
    run(list(range(IMAGES)), 1)
    batch, single = alternate(
        lambda: run(list(range(IMAGES))),
        lambda: [run([i]) for i in range(IMAGES)],
        time.process_time,
        args.rounds,
    )
    rows = [
        Row("diffusers pipeline, batch 4 (one call)", batch.times),
        Row("diffusers pipeline, batch 1 × 4", single.times),
    ]
    return rows, batch.results[0]


# -- through vramgate --------------------------------------------------------------------
Answer = tuple[str, float, np.ndarray]  # X-Vramgate-Batch, seconds queued, the pixels


def generate(url: str, index: int, side: int, steps: int) -> Answer:
    """One image from the server: its batch, how long it waited in the queue, its pixels."""
    body = {
        "model": MODEL, "prompt": PROMPTS[index], "n": 1, "size": f"{side}x{side}",
        "seed": SEEDS[index], "steps": steps, "output_format": "png",
    }  # fmt: skip
    answer = httpx.post(url + "/v1/images/generations", json=body, timeout=1800)
    answer.raise_for_status()
    encoded = answer.json()["data"][0]["b64_json"]
    with Image.open(io.BytesIO(base64.b64decode(encoded))) as image:
        pixels = np.array(image.convert("RGB"))
    waited = float(answer.headers["X-Vramgate-Queue-Ms"]) / 1000
    return answer.headers["X-Vramgate-Batch"], waited, pixels


def at_once(url: str, side: int, steps: int) -> list[Answer]:
    results: list[Any] = [None] * IMAGES

    def one(index: int) -> None:
        results[index] = generate(url, index, side, steps)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(IMAGES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if any(result is None for result in results):
        raise RuntimeError("a request failed: see the server's log (bench-vramgate.log)")
    return results


def config_file(folder: Path, root: Path) -> Path:
    config = root / "config.toml"
    config.write_text(
        f'[[models]]\nname = "{MODEL}"\nkind = "diffusion"\npath = "{folder.as_posix()}"\n'
        f'max_batch = {IMAGES}\nload = "startup"\n'
    )
    return config


def server_runs(folder: Path, root: Path, args: argparse.Namespace) -> tuple[list[Row], Any]:
    """Four at once against the same four one after the other; the batch's pixels."""
    extra = (
        "--cpu-threads", str(args.threads), "--max-batch-wait-ms", str(WAIT_MS),
        "--queue-timeout", "1800", "--run-timeout", "1800",
    )  # fmt: skip
    server = start_vramgate(config_file(folder, root), MODEL, "/v1/images/generations", extra)
    side, steps = args.side, args.steps
    try:
        generate(server.url, 0, side, 1)  # warm-up: the model's first run at this size
        at_once(server.url, side, 1)
        together, apart = alternate(
            lambda: at_once(server.url, side, steps),
            lambda: [generate(server.url, i, side, steps) for i in range(IMAGES)],
            server.cpu_seconds,
            args.rounds,
        )
    finally:
        server.stop()
    rows = [
        Row(
            "vramgate, four requests at once",
            together.times,
            batch_headers(together),
            queued(together),
        ),
        Row("vramgate, four one after the other", apart.times, batch_headers(apart), queued(apart)),
    ]
    return rows, np.stack([pixels for _, _, pixels in together.results[0]])


def queued(rounds: Rounds) -> list[float]:
    """Per round, the four answers' X-Vramgate-Queue-Ms added up, in seconds."""
    return [sum(queue for _, queue, _ in answers) for answers in rounds.results]


def batch_headers(rounds: Rounds) -> str:
    """Each answer's X-Vramgate-Batch, round by round."""
    each = [",".join(batch for batch, _, _ in answers) for answers in rounds.results]
    return "X-Vramgate-Batch " + " / ".join(each)


def measure(args: argparse.Namespace, root: Path) -> Result:
    torch.set_num_threads(args.threads)
    folder = root / "sd"
    parameters = save_pipeline(folder, args.channels, args.side)
    direct, expected = direct_runs(folder, args)
    served, pixels = server_runs(folder, root, args)
    difference = int(np.abs(pixels.astype(int) - expected.astype(int)).max())
    return Result([*direct, *served], difference, parameters)


def table(result: Result, args: argparse.Namespace) -> str:
    rows = result.rows
    same_shape = [rows[0].best[0], rows[1].best[0]] * 2  # batch 4, then one at a time
    unet = result.unet_parameters
    lines = [
        f"Random SD 1.5-shaped pipeline (UNet {unet / 1e6:.0f}M parameters, first level "
        f"{args.channels} channels), four {args.side}² images, {args.steps} PNDM steps, "
        f"guidance 7.5, float32 on the CPU, {args.threads} torch threads; best of "
        f"{args.rounds} alternating rounds (every round's wall seconds in the last "
        "column; for vramgate, its four requests' seconds in its queue, added up).",
        "",
        "| run | seconds for 4 images | s per image | ratio to the direct call of the same "
        "shape | CPU s | every round |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row, reference in zip(rows, same_shape, strict=True):
        note = f" ({row.note})" if row.note else ""
        wall, spent = row.best
        every = ", ".join(f"{seconds:.1f}" for seconds, _ in row.rounds)
        if row.queued is not None:
            every += " (queued " + ", ".join(f"{q:.1f}" for q in row.queued) + ")"
        lines.append(
            f"| {row.name}{note} | {wall:.1f} | {wall / IMAGES:.2f} | {wall / reference:.2f} "
            f"| {spent:.1f} | {every} |"
        )
    direct_gain = rows[1].best[0] / rows[0].best[0]
    served_gain = rows[3].best[0] / rows[2].best[0]
    lines += [
        "",
        f"Four at once against four one after the other (best rounds): vramgate "
        f"{served_gain:.2f}× as fast, the direct pipeline {direct_gain:.2f}×. The four "
        f"batched images against the direct batch's: largest pixel difference "
        f"{result.difference} (of 255).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=128, help="image side, a multiple of 8")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--channels", type=int, default=64, help="the UNet's first level")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        text = table(measure(args, Path(scratch)), args)
    print(text)
    if args.write_readme:
        write_readme(text, "images", "bench/images.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
