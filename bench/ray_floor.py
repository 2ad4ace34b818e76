"""Ray Serve alone, in the shape of vramgate's cluster path: the proxy, an ingress that
reads the body, and a second deployment called by handle that answers at once (by a
plain call at /plain, by a streamed call at /stream). What the path costs on this
machine before vramgate does anything:

    python bench/ray_floor.py --port 8633   # serves until Ctrl+C
"""

# No `from __future__ import annotations`: FastAPI reads the routes' parameter types
# after Ray Serve has rewritten the class's methods (as in app/cluster/ingress.py).
import argparse
import signal
import threading
from typing import Any

import ray
from fastapi import FastAPI, Request
from fastapi.responses import Response
from ray import serve

app = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
class Leaf:
    async def plain(self, body: bytes) -> bytes:
        return b'{"object":"list","data":[]}'

    async def stream(self, body: bytes) -> Any:
        yield b"head"
        yield b'{"object":"list","data":[]}'


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
@serve.ingress(app)
class Front:
    def __init__(self, leaf: Any) -> None:
        self.leaf, self.streamed = leaf, leaf.options(stream=True)

    @app.post("/plain")
    async def plain(self, request: Request) -> Response:
        body = await request.body()
        return Response(await self.leaf.plain.remote(body), media_type="application/json")

    @app.post("/stream")
    async def stream(self, request: Request) -> Response:
        body = await request.body()
        parts = [part async for part in self.streamed.stream.remote(body)]
        return Response(parts[-1], media_type="application/json")

    @app.get("/health")
    async def health(self) -> dict[str, bool]:
        return {"ready": True}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ray.init(include_dashboard=False, configure_logging=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(Front.bind(Leaf.bind()), name="floor", route_prefix="/")  # type: ignore[attr-defined]
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
