"""Image benchmark, side by side in one run:

    python bench/vision.py [--seconds 15] [--write-readme]

A small convolutional classifier (a ResNet-style stem and three stages, built here and
scripted with TorchScript, about 0.7 GFLOP per 224² image) classifies 224² PNGs: first
the raw model in this process (decode + normalise + forward, one image at a time, then 8
at a time), then vramgate's predict route with base64 JSON bodies at 1 and 8 concurrent
clients (closed loop, the same client as bench/run.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.engines.torch.vision import normalise_batch  # noqa: E402
from bench.loadgen import run_load  # noqa: E402
from bench.run import one_model_config, start_vramgate, write_readme  # noqa: E402

SIDE = 224


def block(cin: int, cout: int, stride: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        torch.nn.BatchNorm2d(cout),
        torch.nn.ReLU(),
        torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(cout),
        torch.nn.ReLU(),
    )


def classifier() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 7, stride=2, padding=3, bias=False),
        torch.nn.BatchNorm2d(32),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, stride=2, padding=1),
        block(32, 64, 1),
        block(64, 128, 2),
        block(128, 256, 2),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(256, 10),
    ).eval()


def picture(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIDE, 0:SIDE]
    base = np.stack([x, y, (x + y) // 2], axis=-1) % 256
    pixels = (base + rng.integers(0, 16, base.shape)).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def measure_raw(module: torch.jit.ScriptModule, image: bytes, seconds: float) -> dict[int, float]:
    torch.set_num_threads(2)
    rates = {}
    for batch in (1, 8):
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            pixels = [np.array(Image.open(io.BytesIO(image)).convert("RGB")) for _ in range(batch)]
            with torch.inference_mode():
                torch.softmax(module(normalise_batch(pixels)), dim=1).numpy()
            done += batch
        rates[batch] = done / (time.perf_counter() - started)
    return rates


def measure_vramgate(model_path: Path, image: bytes, seconds: float) -> dict[int, tuple]:
    config = one_model_config("cls", "vision", model_path)
    server = start_vramgate(config, "cls", "/v1/models/cls/predict")
    body = {"image": base64.b64encode(image).decode("ascii"), "top_k": 3}
    try:
        results = {}
        for clients in (1, 8):
            load = run_load(
                server.url, "/v1/models/cls/predict", body, clients=clients, warmup_s=3,
                seconds=seconds,
            )  # fmt: skip
            result = asyncio.run(load)
            results[clients] = (result.rps, result.percentile(0.5) * 1000, result.errors)
        return results
    finally:
        server.stop()


def render(raw: dict[int, float], ours: dict[int, tuple]) -> str:
    lines = [
        f"A small scripted classifier on {SIDE}² PNGs, float32 on the CPU.",
        "",
        "| runner | concurrency | images/s | ratio to raw at the same batch | p50 ms | errors |",
        "|---|---|---|---|---|---|",
        f"| raw model, one at a time | 1 | {raw[1]:.1f} | 1.00 | - | - |",
        f"| raw model, batches of 8 | 8 | {raw[8]:.1f} | 1.00 | - | - |",
    ]
    for clients in (1, 8):
        rps, p50, errors = ours[clients]
        ratio = rps / raw[clients]
        lines.append(f"| vramgate | {clients} | {rps:.1f} | {ratio:.2f} | {p50:.1f} | {errors} |")

    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-vision-model-"))
    scripted = torch.jit.script(classifier())
    scripted.save(str(folder / "model.pt"))
    image = picture(1)
    raw = measure_raw(scripted, image, min(args.seconds, 10))
    ours = measure_vramgate(folder / "model.pt", image, args.seconds)
    text = render(raw, ours)
    print(text)
    if args.write_readme:
        write_readme(text, "vision", "bench/vision.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
