"""The runner process: its engine's log read into a footprint, and a runner that cannot
load reported with the engine's own last words (a real child process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.engines.llama_cpp.process import (
    MiB,
    RunnerFailed,
    RunnerOutOfMemory,
    RunnerProcess,
    footprint_of,
)
from app.models.base import LoadOutOfMemory

# Lines as llama.cpp wrote them loading SmolLM2-135M Q4_1 through xllamacpp 2026.10.11549 at
# verbosity 4 (load_tensors in llama-model.cpp, llama_kv_cache in llama-kv-cache.cpp,
# sched_reserve and llama_context in llama-context.cpp), CPU and a CUDA load's shapes.
CPU_LOAD = """\
0.00.089.575 I print_info: file size   = 92.10 MiB (5.74 BPW)
0.00.235.148 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
0.00.238.199 I llama_context:        CPU  output buffer size =     0.38 MiB
0.00.238.324 I llama_kv_cache:        CPU KV buffer size =    45.00 MiB
0.00.268.534 I llama_kv_cache: size =   45.00 MiB (  1024 cells,  30 layers,  2/2 seqs), K ...
0.00.271.589 I sched_reserve:        CPU compute buffer size =    15.64 MiB
0.00.299.458 I srv          init: listening on http://127.0.0.1:34655
""".splitlines()

SPLIT_LOAD = """\
load_tensors: offloading 20 repeating layers to GPU
load_tensors: offloaded 20/31 layers to GPU
load_tensors:        CUDA0 model buffer size =    61.40 MiB
load_tensors:   CPU_Mapped model buffer size =    30.70 MiB
llama_context:  CUDA_Host  output buffer size =     0.38 MiB
llama_kv_cache:      CUDA0 KV buffer size =    30.00 MiB
llama_kv_cache:        CPU KV buffer size =    15.00 MiB
sched_reserve:      CUDA0 compute buffer size =    15.64 MiB
sched_reserve:  CUDA_Host compute buffer size =     2.02 MiB
""".splitlines()


def test_a_cpu_load_is_all_host_memory_by_what_it_holds():
    found = footprint_of(CPU_LOAD)
    assert found.device == {}
    assert found.host == {
        "model": int(92.10 * MiB),
        "output": int(0.38 * MiB),
        "KV": 45 * MiB,
        "compute": int(15.64 * MiB),
    }
    # the KV size line ("size = 45.00 MiB (1024 cells ...)") is not counted a second time
    assert found.host_bytes == int(92.10 * MiB) + int(0.38 * MiB) + 45 * MiB + int(15.64 * MiB)


def test_a_split_load_counts_cuda_buffers_on_the_device_and_pinned_host_ones_in_ram():
    found = footprint_of(SPLIT_LOAD)
    assert found.device == {
        "model": int(61.40 * MiB),
        "KV": 30 * MiB,
        "compute": int(15.64 * MiB),
    }
    assert found.host["compute"] == int(2.02 * MiB)  # CUDA_Host is pinned RAM, not VRAM
    assert found.host["output"] == int(0.38 * MiB)
    assert (found.layers_on_device, found.layers) == (20, 31)


def test_speculative_decodings_ngram_pool_is_host_memory_of_the_load():
    # as llama.cpp logs it when its runner speculates with ngram-mod (common/speculative.cpp)
    found = footprint_of(
        [*CPU_LOAD, "0.00.405.091 I spec common_specu: - mod size=4194304 (16.000 MB)"]
    )
    assert found.host["ngram"] == 16 * MiB and found.device == {}
    assert found.host_bytes == footprint_of(CPU_LOAD).host_bytes + 16 * MiB


def test_a_speculating_runners_output_buffer_is_counted_as_large_as_it_grows():
    """llama.cpp logs the output buffer it allocates at load (a row of logits a slot)
    and grows it when a batch outputs more rows, up to n_outputs_max: 32 slots of
    SmolLM2 with drafts of 24 logged 6.00 MiB and grow to 512 rows of 49,152 floats."""
    lines = [
        "0.00.409.042 I print_info: n_vocab               = 49152",
        "0.00.420.679 I llama_context: n_outputs_max         = 512",
        "0.00.420.692 I llama_context: n_outputs_max_per_seq = 25",
        "0.00.424.639 I llama_context:        CPU  output buffer size =     6.00 MiB",
    ]
    assert footprint_of(lines).host == {"output": 512 * 49152 * 4}
    cuda = [*lines[:3], "llama_context:  CUDA_Host  output buffer size =     6.00 MiB"]
    assert footprint_of(cuda).host == {"output": 96 * MiB} and footprint_of(cuda).device == {}
    # without drafts a slot outputs one row: what the load logged is what it keeps
    plain = [lines[0], "0.00.420.679 I llama_context: n_outputs_max         = 2", CPU_LOAD[2]]
    assert footprint_of(plain).host == {"output": int(0.38 * MiB)}


# A draft model's load after its target's, as the runner logged it here (SmolLM2-135M
# Q4_1 as its own draft, 2,048 cells, 4 slots, drafts of up to 16: the target's
# n_outputs_max is a slot's draft and the token before it, the draft's a row a slot)
DRAFTED_LOAD = """\
0.00.145.549 I print_info: n_vocab               = 49152
0.00.152.875 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
0.00.155.608 I llama_context: n_outputs_max         = 68
0.00.155.672 I llama_context:        CPU  output buffer size =     0.75 MiB
0.00.155.767 I llama_kv_cache:        CPU KV buffer size =    45.00 MiB
0.00.183.124 I sched_reserve:        CPU compute buffer size =    20.39 MiB
0.03.164.800 I common_speculative_init_result: loading draft model '/tmp/d51/draft.gguf'
0.03.305.230 I print_info: n_vocab               = 49152
0.03.312.510 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
0.03.314.822 I llama_context: n_outputs_max         = 4
0.03.314.887 I llama_context:        CPU  output buffer size =     0.75 MiB
0.03.314.969 I llama_kv_cache:        CPU KV buffer size =    45.00 MiB
0.03.340.882 I sched_reserve:        CPU compute buffer size =    16.64 MiB
0.09.292.706 I srv    load_model: speculative decoding context initialized
""".splitlines()


def test_a_draft_models_buffers_are_the_loads_and_each_output_buffer_grows_its_own_way():
    found = footprint_of(DRAFTED_LOAD)
    assert found.host["model"] == 2 * int(92.10 * MiB) and found.host["KV"] == 90 * MiB
    assert found.host["compute"] == int(20.39 * MiB) + int(16.64 * MiB)
    # the target's grows to 68 rows of logits, the draft's keeps its row a slot
    assert found.host["output"] == 68 * 49152 * 4 + int(0.75 * MiB)
    assert found.speculation_failed is None


def test_a_draft_model_llama_cpp_could_not_pair_is_said():
    """llama.cpp serves on without drafts; the footprint keeps its reason (as it logged it
    for a draft of another vocabulary: common/speculative.cpp's runtime_error, through
    tools/server's load_model)."""
    said = (
        "0.06.333.485 E srv    load_model: failed to initialize speculative decoding "
        "context: draft model vocab type must match target model to use speculation"
    )
    found = footprint_of([*CPU_LOAD[:-1], said, CPU_LOAD[-1]])
    assert found.speculation_failed == (
        "draft model vocab type must match target model to use speculation"
    )
    assert footprint_of(CPU_LOAD).speculation_failed is None


RUNNER = [sys.executable, "-m", "app.engines.llama_cpp.runner_main"]


def runner_config(model: Path, cells: int = 512) -> dict:
    """A runner's settings: `model` on the CPU, one slot of `cells`."""
    return {
        "model": str(model),
        "n_ctx": cells,
        "parallel": 1,
        "gpu_layers": 0,
        "kv_type": "F16",
        "flash_attention": "auto",
        "threads": 1,
        "cache_ram_mib": 0,
        "key": "k",
    }


def test_a_runner_that_cannot_load_says_why_in_its_engines_words(tmp_path):
    missing = tmp_path / "nothing-here.gguf"
    runner = RunnerProcess("broken", RUNNER)
    with pytest.raises(RunnerFailed) as failed:
        runner.start(runner_config(missing), timeout_s=60)
    assert "RuntimeError" in str(failed.value)
    assert str(missing) in str(failed.value) or "failed to load" in str(failed.value)
    assert runner.exited() is not None  # nothing left running


def test_a_load_llama_cpp_cannot_allocate_is_out_of_memory_and_its_twin_loads(smollm2_gguf):
    """A real allocation failure: SmolLM2's KV cache at 67 million cells (1.4 TB) asked
    of this machine's RAM. llama.cpp says so in its own words (ggml_aligned_malloc's
    'insufficient memory', then 'failed to allocate buffer for kv cache'): the runner's
    failure is an out-of-memory (a load to try again once memory is back, not a broken
    model), and nothing is left running. The positive control: at 512 cells it loads."""
    runner = RunnerProcess("too-big", RUNNER)
    with pytest.raises(RunnerOutOfMemory) as failed:
        runner.start(runner_config(smollm2_gguf, 2**26), timeout_s=120)
    assert isinstance(failed.value, LoadOutOfMemory)
    assert "failed to allocate buffer for kv cache" in str(failed.value)
    assert runner.exited() is not None
    twin = RunnerProcess("fits", RUNNER)
    try:
        assert "address" in twin.start(runner_config(smollm2_gguf), timeout_s=120)
    finally:
        twin.stop(5.0)
