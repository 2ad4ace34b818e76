"""Operations routes: /health, /status, /metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from app.service import InferenceService
from app.status import build_status

router = APIRouter(tags=["ops"])


def _service(request: Request) -> InferenceService:
    return request.app.state.service


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 when ready to serve; 503 while loading, after a device failure, or when wedged."""
    service = _service(request)
    ready = service.ready
    body = {"live": True, "ready": ready, "state": service.state}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/status")
async def status(request: Request) -> dict[str, Any]:
    return build_status(_service(request))


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    service = _service(request)
    m = service.metrics
    snap = service.snapshot()
    m.queue_depth.set(service.gate.depth)
    m.running.set(service.gate.running)
    m.pool.set(service.pool_bytes())
    m.admitted.set(service.gate.held_bytes)
    m.device_total.set(snap.total)
    m.device_used.set(snap.total - snap.free)
    m.device_ours.set(snap.ours)
    m.ready.set(1 if service.ready else 0)
    for row in service.book.snapshot():
        if row["price_bytes"] is not None:
            m.price.labels(row["model"], row["bucket"]).set(row["price_bytes"])
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
