"""Which quantisation of a GGUF model fits this machine, answered before the download:
`vramgate fits SOURCE`, `GET /admin/models/fits`, and a pull that could never fit
refused before its first byte.

SOURCE is what `pull` takes: a Hub repo (`hf:ORG/NAME[:QUANT]`), one of Ollama's library
names (`qwen3:4b`), or a local `.gguf` file. Of a repo, the listing gives each
quantisation's files and sizes; the header of the one a pull would fetch is read with
HTTP Ranges (app.store.hub_header: a few MiB, never the weights), and gives the geometry
every quantisation shares (layers, widths, trained context) and that one's exact tensor
bytes. The others' tensor bytes are scaled from it by their file sizes (`from_header`
says which). Each is planned by the planner its load uses
(app.engines.llama_cpp.load.plan, at the defaults `pull` writes into the config, or a
given context), against two rooms of this machine (app.store.machine): what the device
has for a model now, measured, and the most it could have (the device less its reserve,
nothing else on it; all of the RAM). The verdicts: on the GPU whole (`gpu`), with some layers on
the CPU (`split`, the layers and the RAM they take), on a CPU device (`cpu`), or not at
all (`no`). A pull is refused only where its quantisation does not fit even the most.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from app.engines.gguf_facts import GgufFacts, read_gguf_facts
from app.engines.llama_cpp.kv_pool import slots_for
from app.engines.llama_cpp.layer_split import compute_bytes, kv_bytes
from app.engines.llama_cpp.load.plan import LoadSettings, host_bytes, plan_load
from app.engines.llama_cpp.speculation import DEFAULT as DEFAULT_SPECULATION
from app.store.hub import DEFAULT_QUANT, Quant, choose, list_repo, quants_of
from app.store.hub_header import remote_facts
from app.store.machine import Machine
from app.store.sources import PullError, Source, parse_source

Verdict = Literal["gpu", "split", "cpu", "no"]
GiB = 2**30


@dataclass(frozen=True)
class Placement:
    """One quantisation planned in one room."""

    verdict: Verdict
    context: int  # the tokens one request may hold
    kv_cells: int  # the KV pool's cells
    layers: int
    gpu_layers: int  # of `layers`, on the device
    device_bytes: int  # on the device (on a CPU device: in RAM)
    host_bytes: int  # in RAM beside a GPU (the layers left on the CPU)
    room_bytes: int  # the device's room it was planned in
    kv_bytes: int = 0  # its KV pool's (a sliding-window layer's at its window's cells)


@dataclass(frozen=True)
class QuantFit:
    label: str
    files: tuple[str, ...]
    file_bytes: int
    weights_bytes: int
    kv_bytes_per_token: int  # its KV pool's bytes a cell, at the most room
    compute_bytes: int
    from_header: bool  # its own header read; else scaled from the one read by file size
    now: Placement
    most: Placement


@dataclass(frozen=True)
class Fits:
    """A source's quantisations, each planned here; `chosen` is the one `pull` fetches."""

    source: str
    repo: str | None  # None: a local file
    library: str | None  # the Ollama library name it was asked by
    machine: Machine
    quants: tuple[QuantFit, ...]  # by size
    chosen: str
    header_bytes: int  # fetched from the Hub to answer

    def quant(self, label: str) -> QuantFit:
        return next(q for q in self.quants if q.label == label)

    def refusal(self) -> str | None:
        """Why a pull of `chosen` is refused (it fits nowhere here), or None."""
        fit = self.quant(self.chosen)
        if fit.most.verdict != "no":
            return None
        return (
            f"{self.source} ({fit.label}) cannot fit on this machine at all: it needs "
            f"{_needs(fit.most)}, and {_where(self.machine)}; {INSTEAD}"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, document: dict[str, Any]) -> Fits:
        """A Fits from its `as_dict` (what `GET /admin/models/fits` answers)."""
        quants = tuple(
            QuantFit(
                **{k: v for k, v in q.items() if k not in ("files", "now", "most")},
                files=tuple(q["files"]),
                now=Placement(**q["now"]),
                most=Placement(**q["most"]),
            )
            for q in document["quants"]
        )
        machine = Machine(**document["machine"])
        fields = ("source", "repo", "library", "chosen", "header_bytes")
        return cls(**{k: document[k] for k in fields}, machine=machine, quants=quants)


def _gib(nbytes: int) -> str:
    return f"{nbytes / GiB:.2f} GiB ({nbytes} bytes)"


def _needs(placed: Placement) -> str:
    if placed.host_bytes:
        return f"{_gib(placed.device_bytes)} on the device and {_gib(placed.host_bytes)} of RAM"
    return _gib(placed.device_bytes)


def place(
    facts: GgufFacts, settings: LoadSettings, machine: Machine, room: int, host_room: int
) -> Placement:
    """`facts` planned with `room` bytes on the device and `host_room` of RAM beside it."""
    plan = plan_load(facts, settings, accelerator=machine.accelerator, free_bytes=room)
    pool, split = plan.pool, plan.split
    kv = kv_bytes(facts, settings.kv_type, pool.cells, pool.slots)
    if not machine.accelerator:
        verdict: Verdict = "cpu" if split.device_bytes <= room else "no"
        return Placement(
            verdict, pool.per_request, pool.cells, split.layers, 0, split.device_bytes, 0, room, kv
        )
    host = host_bytes(facts, settings.kv_type, pool.cells, split.on_device, pool.slots)
    verdict = "split" if host <= host_room else "no"
    if split.on_device >= split.layers:
        verdict = "gpu"
    return Placement(
        verdict,
        pool.per_request,
        pool.cells,
        split.layers,
        split.on_device,
        split.device_bytes,
        host,
        room,
        kv,
    )


def scaled(facts: GgufFacts, file_bytes: int, label: str) -> GgufFacts:
    """Another quantisation of the same model, from its file size: the tensors' bytes of
    the one read, scaled to the other's file less the header's bytes."""
    tensors = sum(facts.layer_bytes) + facts.other_bytes
    ratio = max(file_bytes - (facts.file_bytes - tensors), 1) / max(tensors, 1)
    return replace(
        facts,
        layer_bytes=tuple(round(b * ratio) for b in facts.layer_bytes),
        other_bytes=round(facts.other_bytes * ratio),
        file_bytes=file_bytes,
        quantization=label,
    )


def quant_fit(
    label: str,
    files: tuple[str, ...],
    facts: GgufFacts,
    machine: Machine,
    settings: LoadSettings,
    from_header: bool,
) -> QuantFit:
    most = place(facts, settings, machine, machine.most_bytes, machine.host_total_bytes)
    return QuantFit(
        label=label,
        files=files,
        file_bytes=facts.file_bytes,
        weights_bytes=sum(facts.layer_bytes) + facts.other_bytes,
        kv_bytes_per_token=most.kv_bytes // max(most.kv_cells, 1),
        compute_bytes=compute_bytes(facts, most.kv_cells, slots_for(most.kv_cells, None)),
        from_header=from_header,
        now=place(facts, settings, machine, machine.free_bytes, machine.host_free_bytes),
        most=most,
    )


def fits(text: str, machine: Machine, context: int | None = None) -> Fits:
    """What `text` (as `pull` takes it) needs here, each quantisation of it; PullError
    where it is no GGUF model or the Hub cannot be read."""
    # as a model with no settings loads: speculating (its drafts' buffers and pool)
    settings = LoadSettings(context=context, **DEFAULT_SPECULATION.load_fields())
    source = parse_source(text)
    if source.kind == "path" and Path(source.ref).suffix.lower() == ".gguf":
        return _local(text, Path(source.ref), machine, settings)
    if source.kind != "hub":
        raise PullError(
            f"{text!r}: fits plans GGUF models: a Hugging Face repo of GGUF files, one of "
            "Ollama's library names, or a .gguf file"
        )
    return _remote(text, source, machine, settings)


def _local(text: str, path: Path, machine: Machine, settings: LoadSettings) -> Fits:
    try:
        facts = read_gguf_facts(path)
    except ValueError as exc:
        raise PullError(str(exc)) from exc
    label = facts.quantization
    fit = quant_fit(label, (path.name,), facts, machine, settings, True)
    return Fits(text, None, None, machine, (fit,), label, 0)


def _remote(text: str, source: Source, machine: Machine, settings: LoadSettings) -> Fits:
    listing = Listing.of(source)
    facts, fetched = listing.chosen_facts()
    fitted = []
    for quant in sorted(listing.quants.values(), key=lambda q: q.size):
        own = quant is listing.chosen
        facts_of = facts if own else scaled(facts, quant.size, quant.label)
        fitted.append(quant_fit(quant.label, quant.files, facts_of, machine, settings, own))
    chosen = listing.chosen.label
    return Fits(text, source.ref, source.library, machine, tuple(fitted), chosen, fetched)


@dataclass(frozen=True)
class Listing:
    """A GGUF repo as the Hub lists it: its commit, its files' sizes, its quantisations
    and the one a pull of the source fetches."""

    repo: str
    commit: str
    sizes: dict[str, int]
    quants: dict[str, Quant]
    chosen: Quant

    @classmethod
    def of(cls, source: Source) -> Listing:
        info = list_repo(source.ref)
        sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
        quants = quants_of(sizes)
        if not quants:
            raise PullError(f"{source.ref} has no GGUF files: fits plans GGUF models (llama.cpp's)")
        default = source.default_quant or DEFAULT_QUANT
        chosen, _ = choose(quants, source.quant, source.ref, default)
        return cls(source.ref, str(info.sha), sizes, quants, chosen)

    def chosen_facts(self) -> tuple[GgufFacts, int]:
        """The chosen quantisation's facts from its header, and the bytes fetched."""
        return remote_facts(self.repo, self.commit, [(f, self.sizes[f]) for f in self.chosen.files])


def pull_refusal(text: str, machine: Machine) -> str | None:
    """Why a pull of `text` is refused before its download: its quantisation cannot fit
    on this machine even with nothing else on it; None where it may (or `text` is no Hub
    GGUF). The listing decides where it can: a file larger than all the machine's memory
    is refused as it is listed, one smaller than half of it fits at least split; between
    the two its header is read and it is planned as its load would be."""
    source = parse_source(text)
    if source.kind != "hub":
        return None
    try:
        listing = Listing.of(source)
    except PullError:
        return None  # the pull itself says what is wrong with it
    size = listing.chosen.size
    most = machine.most_bytes + (machine.host_total_bytes if machine.accelerator else 0)
    if 2 * size <= most:
        return None
    label = listing.chosen.label
    if size > most:
        return (
            f"{text} ({label}) cannot fit on this machine at all: its files alone are "
            f"{_gib(size)}, and {_where(machine)}; {INSTEAD}"
        )
    facts, _ = listing.chosen_facts()
    settings = LoadSettings(**DEFAULT_SPECULATION.load_fields())
    fit = quant_fit(label, listing.chosen.files, facts, machine, settings, True)
    if fit.most.verdict != "no":
        return None
    return (
        f"{text} ({label}) cannot fit on this machine at all: it needs {_needs(fit.most)}, "
        f"and {_where(machine)}; {INSTEAD}"
    )


def fitted_source(source: Source, machine: Machine) -> tuple[Source, str | None]:
    """One of Ollama's names whose tag names only a size (`qwen3:4b`), at the quantisation
    the verdicts pick here: the table's where it fits the GPU whole with nothing else on
    it, else the largest smaller one that does (what it chose and why, in words); any
    other source, or no such smaller one, as it is (None)."""
    if source.library is None or source.quant is not None or not machine.accelerator:
        return source, None
    try:
        found = _remote(source.library, source, machine, LoadSettings())
    except PullError:
        return source, None  # the pull itself says what is wrong
    table = found.quant(found.chosen)
    if table.most.verdict == "gpu":
        return source, None
    whole = [q for q in found.quants if q.most.verdict == "gpu" and q.file_bytes < table.file_bytes]
    if not whole:
        return source, None
    picked = whole[-1]  # by size: the largest that fits whole
    why = (
        f"{picked.label}: the largest quantisation of {found.repo} that fits {machine.device} "
        f"whole ({table.label}, the names table's, {said(table.most)})"
    )
    return replace(source, default_quant=picked.label), why


INSTEAD = (
    "pick a smaller quantisation or model (`vramgate fits` lists them), or pull anyway with --force"
)


def _where(machine: Machine) -> str:
    """The most this machine has for a model, in words."""
    said = (
        f"the most this machine has for a model is {_gib(machine.most_bytes)} on {machine.device}"
    )
    if machine.accelerator:
        said += f" and {_gib(machine.host_total_bytes)} of RAM"
    return said


WHERE = {
    "gpu": "fits on the GPU",
    "split": "fits with {cpu} of {layers} layers on the CPU",
    "cpu": "fits in RAM (the CPU)",
    "no": "does not fit",
}


def said(placed: Placement) -> str:
    """A placement in words: where it goes, with what context, and its bytes."""
    where = WHERE[placed.verdict].format(
        cpu=placed.layers - placed.gpu_layers, layers=placed.layers
    )
    bytes_ = f"{placed.device_bytes / GiB:.2f} GiB"
    if placed.host_bytes:
        bytes_ += f" + {placed.host_bytes / GiB:.2f} GiB RAM"
    return f"{where}, {placed.context} tokens a request ({bytes_})"


def format_fits(found: Fits) -> str:
    """`vramgate fits`' table: each quantisation, its file, and where it fits now and at
    most."""
    machine = found.machine
    named = f" = {found.repo}" if found.repo and found.repo != found.source else ""
    ram = machine.host_free_bytes / GiB, machine.host_total_bytes / GiB
    lines = [
        f"{found.source}{named}: on {machine.device}, {machine.free_bytes / GiB:.2f} GiB free "
        f"for a model now, {machine.most_bytes / GiB:.2f} GiB at most"
        + (f"; RAM {ram[0]:.1f} of {ram[1]:.1f} GiB free" if machine.accelerator else "")
    ]
    for fit in found.quants:
        mark = "*" if fit.label == found.chosen else " "
        guess = "" if fit.from_header else " (scaled by file size)"
        lines.append(
            f"{mark} {fit.label:<12} {fit.file_bytes / GiB:6.2f} GiB file{guess}: now "
            f"{said(fit.now)}; at most {said(fit.most)}"
        )
    lines.append(
        f"* what `vramgate pull` fetches; read from its header ({found.header_bytes} bytes "
        "fetched), planned as its load plans it"
    )
    return "\n".join(lines)
