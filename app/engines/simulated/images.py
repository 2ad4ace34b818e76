"""A simulated text-to-image model (`kind = "simulated"` with an `images` setting): what a
diffusion model costs, without a GPU or weights, for tests and demos of image admission.

It declares a price by pixels (`SimulatedImages.bytes_per_pixel`: the first quote, as a
real pipeline's geometry gives one) and really holds its true bytes on the device for its
run (`true_bytes_per_pixel`, times the fault injection's jitter): the server does not know
them and must learn a price per size, as it does on a GPU. A run whose VAE decode is tiled
(the bucket's `~tiled` variant, chosen by the server when only that fits) holds a tile's
decode, never less than its denoising's share. Rows and buckets are every image
generator's (app.models.image_buckets); each step reports to its requests' progress and a
run stops once every client of it has left, as the diffusion handler's does.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any

import numpy as np

from app.config.settings import ModelSpec, SimulatedImages
from app.engines.simulated.model import SimulatedWeights, TrueJitter
from app.models.image_buckets import ImageBucket
from app.models.image_prompt import ImagePrompt
from app.models.images import encode_image
from app.models.kinds import ImageGenerator
from app.models.prepared import Bucket, Prepared
from app.models.stages import InThreads


class SimulatedImageHandler(InThreads, SimulatedWeights, ImageGenerator):
    kind = "simulated"
    engine = "simulated"
    postprocess_on_loop = False  # encoding images stays off the event loop
    preprocess_on_loop = False

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        assert spec.images is not None, "the registry builds this for an images setting"
        self.images: SimulatedImages = spec.images
        self.default_size = (self.images.default_size, self.images.default_size)
        self._lock = threading.Lock()  # guards forward_calls
        self._jitter = TrueJitter(spec)

    def _bytes(self, bucket: ImageBucket, per_pixel: float) -> int:
        """A run of `bucket` at `per_pixel` bytes a pixel: the full image's decode, or
        a tiled one's (a tile, or the denoising's share of the image if more)."""
        image = bucket.width * bucket.height
        if bucket.tiled:
            tile = min(bucket.width, self.images.tile) * min(bucket.height, self.images.tile)
            image = max(tile, int(self.images.denoise_share * image))
        return int(per_pixel * image * bucket.batch)

    def prior_bytes(self, bucket: Bucket) -> int:
        parsed = ImageBucket.parse(bucket.label)
        return 0 if parsed is None else self._bytes(parsed, self.images.bytes_per_pixel)

    def true_bytes(self, bucket: ImageBucket) -> int:
        """What one run really holds: unknown to the server in advance."""
        per_pixel = self.images.true_bytes_per_pixel or self.images.bytes_per_pixel
        return self._jitter(self._bytes(bucket, per_pixel))

    def forward(self, prepared: Prepared) -> Any:
        assert self._device is not None, "load() first"
        with self._lock:
            self.forward_calls += 1
        bucket = ImageBucket.parse(prepared.bucket.label)
        assert bucket is not None, "its own preprocess made the label"
        rows: list[ImagePrompt] = prepared.payload
        steps = rows[0].steps or self.images.steps
        step_s = self.images.step_ms * bucket.width * bucket.height / 1e6 / 1000
        with self.batch_running(prepared) as progresses, self._device.hold(self.true_bytes(bucket)):
            for step in range(steps):
                if all(progress.cancelled for progress in progresses):
                    break  # every client left: the rest is skipped, as diffusers' interrupt
                time.sleep(step_s)
                self.progress_at = time.monotonic()
                for progress in progresses:
                    progress.advance(step + 1, steps)
        return [(_pixels(row), row.output_format) for row in rows]

    def postprocess(self, raw: Any) -> Any:
        return [encode_image(pixels, output_format) for pixels, output_format in raw]


def _pixels(row: ImagePrompt) -> np.ndarray:
    """One colour per (prompt, seed): the same request gives the same image."""
    assert row.width is not None and row.height is not None
    colour = zlib.crc32(f"{row.prompt}\0{row.seed}".encode()).to_bytes(4, "little")[:3]
    shape = (row.height, row.width, 3)
    return np.ascontiguousarray(np.broadcast_to(np.frombuffer(colour, dtype=np.uint8), shape))
