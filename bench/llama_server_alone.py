"""llama.cpp's own server on a GGUF, alone (the peer of bench/generation.py's engines
table): xllamacpp's Server with its HTTP listener on 127.0.0.1:PORT, as a person runs
it, set up like vramgate's runner (the context per slot, the slots, no fitting, no host
prompt cache) so the two differ only by vramgate's path. Lives until killed.

    python bench/llama_server_alone.py MODEL.gguf --port 8090 --context 2048 --parallel 8
"""

from __future__ import annotations

import argparse
import signal
import threading

import xllamacpp as xlc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--context", type=int, default=2048, help="cells per slot")
    parser.add_argument("--parallel", type=int, default=8)
    args = parser.parse_args()
    params = xlc.CommonParams()
    params.model.path = args.model
    params.n_parallel = args.parallel
    params.n_ctx = args.context * args.parallel
    params.n_gpu_layers = 0
    params.fit_params = False
    params.cache_ram_mib = 0
    params.use_jinja = True
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    server = xlc.Server(params)
    print(f"llama.cpp serving on {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()


if __name__ == "__main__":
    main()
