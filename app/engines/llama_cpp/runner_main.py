"""The llama.cpp runner's own process (one per loaded GGUF model, as Ollama runs its
runners): a native abort or a DLL clash ends this process, never the server.

It reads its settings as one JSON line on stdin (the API key among them, so it is in no
command line), loads the model with `xllamacpp.Server` (the constructor is the load),
prints one JSON line on stdout, `{"address": ..., "pid": ...}` or `{"error": ...}`, and
lives until its stdin closes: the server closes it to unload, and the OS closes it when
the server dies (or the parent it was started by is gone: checked every
`PARENT_CHECK_S` from the moment its settings are read, before anything loads), so a
runner never outlives its server, not even during a load of tens of seconds. While it
loads, Linux also kills it the moment the thread that started it ends
(`PR_SET_PDEATHSIG`, which needs no Python thread to run: a load may hold the
interpreter); the server's loading thread waits for the ready line, so the signal is
cleared just before that line is printed, and the parent watch goes on alone (on
Windows the server's job object ends its runners with it). It then exits at once,
abandoning what it was computing: `del server` would first wait for the batch in flight
(a long prefill kept a runner alive for 24 s after its server was killed), and the OS
frees all it holds anyway. llama.cpp's HTTP listener, bound
to 127.0.0.1 on a free port and guarded by the key, is how the server talks to it.
llama.cpp writes its log (with the buffer sizes it allocated) to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

RUNNER_COMMAND = "_llama-runner"  # the bundle's executable runs this module with it (app.cli)
PARENT_CHECK_S = 0.25
PROMPT_BATCH = 512  # prompt tokens a decode call takes: a progress event after each


def params_of(config: dict[str, Any]) -> Any:
    """xllamacpp's CommonParams from our runner settings (see app.engines.llama_cpp.generation)."""
    import xllamacpp as xlc

    p = xlc.CommonParams()
    p.model.path = config["model"]
    p.n_ctx = int(config["n_ctx"])
    p.n_parallel = int(config["parallel"])
    # one pool of cells: the gate admits requests for at most all of them
    # (app.engines.llama_cpp.kv_pool), each slot up to the cells one request may hold
    p.kv_unified = True
    if config.get("per_slot"):
        p.kv_unified_per_slot = int(config["per_slot"])
    p.n_gpu_layers = int(config["gpu_layers"])
    p.fit_params = False  # the gate chose the layers and the context; fit would resize them
    p.cache_type_k = p.cache_type_v = getattr(xlc.ggml_type, f"GGML_TYPE_{config['kv_type']}")
    attention = {"auto": "AUTO", "on": "ENABLED", "off": "DISABLED"}[config["flash_attention"]]
    p.flash_attn_type = getattr(xlc.llama_flash_attn_type, f"LLAMA_FLASH_ATTN_TYPE_{attention}")
    if config["threads"] > 0:
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = int(config["threads"])
    p.cache_ram_mib = int(config["cache_ram_mib"])
    p.cache_idle_slots = bool(config.get("cache_idle_slots"))  # out of the pool, to RAM
    p.n_cache_reuse = int(config.get("cache_reuse", 0))
    if config.get("embedding"):  # vectors, not text: each input whole in one micro-batch
        p.embedding = True
        # one KV pool also here: with split per-slot KV, xllamacpp 2026.10 gave wrong
        # vectors for all but one of several inputs decoded together
        # (tests/engines/llama_cpp/test_embedding.py); at most `parallel` inputs of at
        # most `context` tokens fit it
        pooling = str(config.get("pooling") or "mean").upper()
        p.pooling_type = getattr(xlc.llama_pooling_type, f"LLAMA_POOLING_TYPE_{pooling}")
        p.n_batch = p.n_ubatch = int(config["n_ctx"]) // int(config["parallel"])
    else:  # a prefill reports its progress after each batch: the server's beats
        p.n_batch = min(PROMPT_BATCH, int(config["n_ctx"]))
    if config.get("speculative"):
        speculate(p, config["speculative"])
    p.use_jinja = True
    p.endpoint_slots = True
    p.endpoint_props = True
    p.endpoint_metrics = True  # requests_deferred: what waited inside llama.cpp
    p.hostnames = ["127.0.0.1"]
    p.port = 0
    p.api_keys = [config["key"]]
    p.verbosity = 4  # the buffer sizes it allocates are logged at 4 only
    return p


def speculate(p: Any, settings: dict[str, Any]) -> None:
    """Speculative decoding on `p` as `settings` say: `kind`, llama.cpp's --spec-type
    name (ngram-mod, ngram-simple, ngram-map-k, ngram-map-k4v draft-free; draft-simple
    with a draft model); `match`, the tokens a draft's n-gram matches; `draft_min` and
    `draft_max`, a draft's tokens (the map kinds have no fewest); for draft-simple,
    `model`, the draft model's .gguf, whose layers go where the target's do (all of them
    on the GPU where the target's are: `gpu_layers`) and whose KV cells are of the
    target's type. The runner's settings carry them as `speculative`;
    bench/llama_server_alone.py --speculative takes the same."""
    import xllamacpp as xlc

    kind = str(settings["kind"])
    name = "COMMON_SPECULATIVE_TYPE_" + kind.upper().replace("-", "_")
    p.speculative.types = [getattr(xlc.common_speculative_type, name)]
    low, high, match = (int(settings[k]) for k in ("draft_min", "draft_max", "match"))
    if kind == "draft-simple":
        draft = p.speculative.draft
        draft.mparams.path = str(settings["model"])
        draft.n_gpu_layers = int(settings["gpu_layers"])
        draft.n_min, draft.n_max = low, high
        draft.cache_type_k, draft.cache_type_v = p.cache_type_k, p.cache_type_v
    elif kind == "ngram-mod":
        mod = p.speculative.ngram_mod
        mod.n_match, mod.n_min, mod.n_max = match, low, high
    elif kind.startswith("ngram-"):  # ngram-simple, ngram-map-k, ngram-map-k4v
        found = getattr(p.speculative, kind.replace("-", "_"))
        found.size_n, found.size_m = match, high


def main() -> int:
    parent = os.getppid()
    config = json.loads(sys.stdin.readline())
    _die_with_loader(True, parent)
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    try:
        import xllamacpp as xlc
    except ImportError as exc:  # the engine itself cannot load here (e.g. CUDA's driver)
        # Windows' words for a CUDA build without the NVIDIA driver (delvewheel leaves
        # nvcuda.dll out): "DLL load failed while importing xllamacpp: The specified
        # module could not be found." (CPython's Python/dynload_win.c)
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "engine": False}), flush=True)
        return 1
    try:
        server = xlc.Server(params_of(config))
    except Exception as exc:  # the cause is on stderr; the parent reads it from there
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    _die_with_loader(False, parent)  # the loading thread ends once it has read the next line
    print(json.dumps({"address": server.listening_address, "pid": os.getpid()}), flush=True)
    sys.stdin.read()  # until the server closes our stdin, or dies
    os._exit(0)  # now, without `del server`: see the module's docstring


def _die_with_loader(on: bool, parent: int) -> None:
    """Linux: SIGKILL this process when the thread that started it ends (`on`), or no
    longer (PR_SET_PDEATHSIG is the parent *thread's* death: the server's loading
    thread ends after the load). Elsewhere nothing: the parent watch and, on Windows,
    the server's job object do it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL) if on else 0)
    if on and os.getppid() != parent:  # it died before the signal was set
        os._exit(0)


def _end_with(parent: int) -> None:
    """Exit when the process that started this one is gone (its stdin may be held open
    by another, where a handle was inherited)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
