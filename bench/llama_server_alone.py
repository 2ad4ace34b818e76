"""llama.cpp's own server on a GGUF, alone (the peer of bench/generation.py's engines
table): xllamacpp's Server with its HTTP listener on 127.0.0.1:PORT, as a person runs
it, set up like vramgate's runner (the context per slot, the slots, no fitting, no host
prompt cache) so the two differ only by vramgate's path. Lives until killed.

    python bench/llama_server_alone.py MODEL.gguf --port 8090 --context 2048 --parallel 8
    python bench/llama_server_alone.py MODEL.gguf --port 8090 --context 1024 --parallel 32 --unified
    python bench/llama_server_alone.py MODEL.gguf --port 8090 --runner '{"n_ctx": 32768, ...}'

`--unified`: one KV pool of context x parallel cells that every slot draws from (a split
KV gives each slot its own context cells). `--speculative`: speculative decoding set by
hand, as vramgate's runner sets it (app.engines.llama_cpp.runner_main.speculate, e.g.
'{"kind": "ngram-mod", "match": 24, "draft_min": 48, "draft_max": 64}'; none by default,
as llama.cpp's own). `--threads`: CPU threads (llama.cpp's default: all cores).
`--runner`: exactly the settings vramgate's runner is started with
(app.engines.llama_cpp.runner_main.params_of), without its key: what they cost, apart
from vramgate's path (bench/kv_shapes.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

import xllamacpp as xlc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def plain_params(model: str, context: int, parallel: int, unified: bool) -> xlc.CommonParams:
    params = xlc.CommonParams()
    params.model.path = model
    params.n_parallel = parallel
    params.n_ctx = context * parallel
    params.kv_unified = unified
    params.n_gpu_layers = 0
    params.fit_params = False
    params.cache_ram_mib = 0
    params.use_jinja = True
    return params


def runner_params(model: str, settings: dict) -> xlc.CommonParams:
    from app.engines.llama_cpp.runner_main import params_of

    params = params_of({"model": model, "key": "", **settings})
    params.api_keys = []
    return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--context", type=int, default=2048, help="cells per slot")
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--unified", action="store_true", help="one KV pool for all slots")
    parser.add_argument("--runner", metavar="JSON", help="vramgate's runner settings instead")
    parser.add_argument("--speculative", metavar="JSON", help="speculative decoding by hand")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: llama.cpp's)")
    args = parser.parse_args()
    if args.runner:
        params = runner_params(args.model, json.loads(args.runner))
    else:
        params = plain_params(args.model, args.context, args.parallel, args.unified)
    if args.speculative:
        from app.engines.llama_cpp.runner_main import speculate

        speculate(params, json.loads(args.speculative))
    if args.threads > 0:
        params.cpuparams.n_threads = params.cpuparams_batch.n_threads = args.threads
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    server = xlc.Server(params)
    print(f"llama.cpp serving on {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()


if __name__ == "__main__":
    main()
