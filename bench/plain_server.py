"""A plain FastAPI endpoint of the embeddings route's shape that returns a constant
64-dimensional vector: what per-request overhead costs with no model at all.
Run: uvicorn bench.plain_server:app --port PORT"""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

VECTOR = [0.125] * 64
app = FastAPI()


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str = "trivial"


@app.post("/v1/embeddings")
async def embeddings(request: EmbeddingRequest) -> dict:
    texts = [request.input] if isinstance(request.input, str) else request.input
    data = [{"object": "embedding", "index": i, "embedding": VECTOR} for i in range(len(texts))]
    usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
    return {"object": "list", "data": data, "model": request.model, "usage": usage}


@app.get("/health")
async def health() -> dict:
    return {"ok": True}
