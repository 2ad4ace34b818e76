"""A model from a Hugging Face repo: its files listed first (huggingface_hub's
`model_info`: names, sizes and the commit), then only what the model needs fetched.

A repo of GGUF files holds one file, or one split set (`-00001-of-0000N.gguf`), per
quantisation: often 15-25 of them of 1-8 GB each. One is fetched: the one named
(`hf:ORG/NAME:Q8_0`, any case), else Q4_K_M (Ollama's default), else the one nearest to
it in bits per weight; with the repo's `mmproj` projector (the F16 one of several). Any
other repo (safetensors) comes as a snapshot of its model files (`snapshot_download`).

Free disk is checked before the first byte. Each GGUF file is fetched into a partial
folder beside the models (`pull-partial/ORG--NAME/COMMIT/`), appended to what an
interrupted pull left there: the next pull of the same commit asks for the rest (an HTTP
Range), never for the bytes it has, and no file grows past the size the listing gave it.
huggingface_hub itself does not resume across processes (its `.incomplete` files are
unique to a process and deleted when a download fails). Two pulls of one repo never
share that folder at once: the second waits for the first (app.store.pull_lock).
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import quote

from app.store.progress import Progress, PullCancelled
from app.store.pull_lock import partial_root, repo_key
from app.store.sources import PullError, Source

SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
QUANT = re.compile(
    r"(?:^|[-._])((?:UD-)?(?:I?Q[1-8](?:_[0-9A-Z]+)*|TQ[12]_0|BF16|FP16|F16|F32|MXFP4(?:_MOE)?))"
    r"(?=$|[-.])",
    re.IGNORECASE,
)
DEFAULT_QUANT = "Q4_K_M"
# About the bits per weight of llama.cpp's quantisation mixes on a Llama-3 8B (within a
# few tenths; a mix's size varies with the model): how near one is to the default where a
# repo has no Q4_K_M. Only their order and distances matter here.
BITS = {
    "IQ1_S": 1.56, "IQ1_M": 1.75, "TQ1_0": 1.69, "TQ2_0": 2.06, "IQ2_XXS": 2.06,
    "IQ2_XS": 2.31, "IQ2_S": 2.5, "IQ2_M": 2.7, "Q2_K": 2.96, "Q2_K_S": 2.96,
    "IQ3_XXS": 3.06, "IQ3_XS": 3.3, "IQ3_S": 3.44, "Q3_K_S": 3.41, "IQ3_M": 3.66,
    "Q3_K_M": 3.74, "Q3_K_L": 4.03, "IQ4_XS": 4.25, "IQ4_NL": 4.5, "Q4_0": 4.55,
    "Q4_K_S": 4.58, "Q4_K_M": 4.89, "Q4_1": 5.0, "MXFP4": 4.25, "MXFP4_MOE": 4.25,
    "Q5_0": 5.54, "Q5_K_S": 5.54, "Q5_K_M": 5.7, "Q5_1": 6.0, "Q6_K": 6.56, "Q8_0": 8.5,
    "F16": 16.0, "FP16": 16.0, "BF16": 16.0, "F32": 32.0,
}  # fmt: skip


@dataclass(frozen=True)
class Quant:
    """One quantisation of a GGUF repo: its label as the files spell it (upper case) and
    its files (one, or the shards of a split GGUF, in order)."""

    label: str
    files: tuple[str, ...]
    size: int


def quant_of(path: str) -> str:
    """The quantisation a GGUF file's name says (`Llama-3.2-3B-Instruct-Q4_K_M.gguf`:
    Q4_K_M; the last such word, a shard's suffix left out), or its name where it says
    none."""
    stem = SHARD.sub("", PurePosixPath(path).name.removesuffix(".gguf").removesuffix(".GGUF"))
    found = QUANT.findall(stem)
    return found[-1].upper() if found else stem


def is_gguf(path: str) -> bool:
    return path.lower().endswith(".gguf")


def is_projector(path: str) -> bool:
    return PurePosixPath(path).name.lower().startswith("mmproj")


def quants_of(sizes: dict[str, int]) -> dict[str, Quant]:
    """The repo's quantisations by upper-case label, from its files and their sizes: a
    whole file, or the shards of one split file, each. Two that say the same quantisation
    (`-Q4_K_M.gguf`, `-Q4_K_M-imat.gguf`) are told apart by their names."""
    sets: dict[str, list[str]] = {}  # by path, a shard's suffix left out
    for path in sorted(sizes):
        if is_gguf(path) and not is_projector(path):
            sets.setdefault(SHARD.sub("", path[: -len(".gguf")]), []).append(path)
    labels = Counter(quant_of(files[0]).upper() for files in sets.values())
    quants: dict[str, Quant] = {}
    for stem, files in sets.items():
        label = quant_of(files[0]).upper()
        if labels[label] > 1:
            label = PurePosixPath(stem).name.upper()
        quants[label] = Quant(label, tuple(files), sum(sizes[f] for f in files))
    return quants


def bits_per_weight(label: str) -> float:
    """From llama.cpp's list; a label it lacks, from its digit (Q5_X: 5.5); none: last.
    A label that is a file's name (two files said one quantisation): the one it says."""
    label = quant_of(label).upper().removeprefix("UD-")
    if label in BITS:
        return BITS[label]
    digit = re.match(r"^I?Q(\d)", label)
    return int(digit[1]) + 0.5 if digit else 1000.0


def choose(
    quants: dict[str, Quant], wanted: str | None, repo: str, default: str = DEFAULT_QUANT
) -> tuple[Quant, str]:
    """The quantisation to fetch, and why it was chosen. Without the one named or the
    default: the nearest to it in bits per weight, then the shortest label, then the
    smallest."""
    listed = ", ".join(q.label for q in sorted(quants.values(), key=lambda q: q.size))
    if wanted is not None:
        if wanted.upper() in quants:
            return quants[wanted.upper()], "the one asked for"
        raise PullError(f"{repo} has no quantisation {wanted}; it has {listed}")
    if default in quants:
        return quants[default], f"the default ({default}, as Ollama's)"
    if len(quants) == 1:
        return next(iter(quants.values())), "the repo's only one"
    target = bits_per_weight(default)
    quant = min(
        quants.values(),
        key=lambda q: (abs(bits_per_weight(q.label) - target), len(q.label), q.size),
    )
    bits = bits_per_weight(quant.label)
    if bits >= 1000:
        return quant, f"no file names a quantisation llama.cpp has; the smallest (of {listed})"
    return quant, (
        f"the repo has no {default}; {quant.label} is the nearest to it in bits per "
        f"weight ({bits:g} against {target:g}; it has {listed})"
    )


def projector(sizes: dict[str, int]) -> str | None:
    """The repo's vision projector: the F16 one of several, else BF16, else the smallest."""
    found = sorted((p for p in sizes if is_gguf(p) and is_projector(p)), key=sizes.__getitem__)
    order = {"F16": 0, "BF16": 1}
    return min(found, key=lambda p: order.get(quant_of(p), 2), default=None)


def check_free_disk(needed: int, free: int, where: Path) -> None:
    """Refuses a download that would not fit, before its first byte."""
    if needed > free:
        raise PullError(
            f"not enough free disk in {where}: the download needs {needed} bytes "
            f"({needed / 2**30:.2f} GiB), {free} bytes ({free / 2**30:.2f} GiB) are free; "
            "free some space, or pull into another --models-dir"
        )


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def model_name(repo: str, quant: str | None) -> str:
    """`bartowski/Llama-3.2-3B-Instruct-GGUF` with Q4_K_M: `Llama-3.2-3B-Instruct-Q4_K_M`.
    Ollama writes `NAME:Q4_K_M`; a model name has no ':' (it names the model's folder,
    and Windows takes no ':' in a file name), so '-' joins them."""
    base = re.sub(r"[-_.]gguf$", "", repo.split("/")[-1], flags=re.IGNORECASE)
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", base).strip("-._") or "model"
    if quant is None or quant.upper() in base.upper():
        return base[:64]
    return f"{base[: 63 - len(quant)]}-{quant}"


def fetch_hub(
    source: Source, scratch: Path, progress: Progress, check_name: Callable[[str], object]
) -> tuple[Path, str]:
    """The repo's model on this disk, under `scratch`, and its name: the repo's, with the
    GGUF quantisation's label. `check_name` refuses a taken name before the download."""
    if source.library is not None:
        progress.step(f"{source.library} is {source.ref} (vramgate's table of Ollama's names)")
    info = list_repo(source.ref)
    sizes = {s.rfilename: int(s.size or 0) for s in info.siblings or []}
    quants = quants_of(sizes)
    if not quants:
        if source.quant is not None:
            raise PullError(
                f"{source.ref} has no GGUF files; :{source.quant} names one of a GGUF repo's "
                "quantisations"
            )
        check_name(model_name(source.ref, None))
        snapshot = download_snapshot(source.ref, sizes, scratch / "hub", progress)
        return snapshot, model_name(source.ref, None)
    quant, why = choose(quants, source.quant, source.ref, source.default_quant or DEFAULT_QUANT)
    files = list(quant.files)
    extra = projector(sizes)
    if extra is not None:
        files.append(extra)
    label = quant.label if QUANT.search(quant.label) else None
    name = model_name(source.ref, label)
    check_name(name)
    progress.step(
        f"{source.ref} has {len(quants)} quantisation{'s' if len(quants) > 1 else ''}; "
        f"fetching {quant.label}: {why}; {len(files)} file{'s' if len(files) > 1 else ''}: "
        f"{', '.join(files)}; served as {name}"
    )
    commit = str(info.sha)
    partial = partial_folder(scratch.parent, source.ref, commit)
    wanted = {f: sizes[f] for f in files}
    download_files(source.ref, commit, wanted, partial, scratch.parent, progress)
    fetched = scratch / "hub"  # the files side by side, their names kept (a split's shards)
    fetched.mkdir()
    for path in files:
        os.replace(partial / path, fetched / PurePosixPath(path).name)  # one disk
    shutil.rmtree(partial.parent)  # `pull-partial` itself goes with the pull's lock
    return fetched, name


def list_repo(repo: str) -> Any:
    """The repo's `ModelInfo`: its commit (`sha`) and files with their sizes."""
    from huggingface_hub import HfApi

    try:
        return HfApi().model_info(repo, files_metadata=True)
    except Exception as exc:
        raise PullError(f"could not download {repo!r} from the Hugging Face hub: {exc}") from exc


def partial_folder(models_dir: Path, repo: str, commit: str) -> Path:
    """Where this commit's files gather until all have come; an older commit's partial
    files (the repo changed since) are deleted."""
    folder = partial_root(models_dir) / repo_key(repo)
    if folder.is_dir():
        for old in folder.iterdir():
            if old.name != commit:
                shutil.rmtree(old, ignore_errors=True)
    return folder / commit


def download_files(
    repo: str, commit: str, sizes: dict[str, int], into: Path, disk: Path, progress: Progress
) -> None:
    """Each file of `sizes` whole in `into` (under its repo path), each resumed from the
    bytes already there; free disk (of the folder `disk`, which holds `into`) checked for
    the bytes still to come before anything is written."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    have: dict[str, int] = {}
    for path, size in sizes.items():
        local = into / path
        if not local.resolve().is_relative_to(into.resolve()):
            raise PullError(f"{repo} names a file outside itself: {path}")
        done = local.stat().st_size if local.is_file() else 0
        if done > size:  # not this file's beginning: fetched again
            local.unlink()
            done = 0
        have[path] = done
    total, done = sum(sizes.values()), sum(have.values())
    check_free_disk(total - done, free_bytes(disk), disk)
    if done:
        progress.step(f"resuming: {done} of {total} bytes are here from an earlier pull")
    progress.begin(f"downloading {repo}", total, done)
    headers = build_hf_headers()
    try:
        for path, size in sizes.items():
            local = into / path
            local.parent.mkdir(parents=True, exist_ok=True)
            url = file_url(constants.ENDPOINT, repo, commit, path)
            download_file(url, local, size, headers, progress.advance)
    except Oversized as exc:
        raise PullError(f"could not download {repo!r} from the Hugging Face hub: {exc}") from exc
    except PullCancelled:
        raise
    except Exception as exc:
        raise PullError(
            f"could not download {repo!r} from the Hugging Face hub: {exc}. What came is "
            f"kept in {into}: pull again to fetch the rest"
        ) from exc
    finally:
        progress.end()


def file_url(endpoint: str, repo: str, commit: str, path: str) -> str:
    """A model repo's file at a commit, as `hf_hub_url` spells it, at `endpoint` (which
    HF_ENDPOINT sets)."""
    return f"{endpoint}/{repo}/resolve/{quote(commit, safe='')}/{quote(path)}"


def download_file(
    url: str,
    local: Path,
    size: int,
    headers: dict[str, str],
    advance: Callable[[int], None],
    tries: int = 5,
) -> None:
    """`url` appended to `local` from the bytes it holds (an HTTP Range for the rest),
    each chunk written as it comes; a connection lost mid-file is taken up again where it
    broke, up to `tries` times. (huggingface_hub's own `http_get` reads 10 MB chunks and
    writes each whole: a pull killed mid-file would lose up to 10 MB of it.)"""
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import hf_raise_for_status, http_stream_backoff

    while True:
        with local.open("ab") as file:
            have = file.tell()
            if have == size:
                return
            asked = headers | ({"Range": f"bytes={have}-"} if have else {})
            try:
                with http_stream_backoff(
                    "GET", url, headers=asked, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT
                ) as response:
                    hf_raise_for_status(response)
                    if have and response.status_code != 206:  # the whole file came again
                        file.truncate(0)
                        file.seek(0)  # where the next write goes, and what tell() says
                        advance(-have)
                    for chunk in response.iter_bytes():
                        room = size - file.tell()
                        file.write(chunk[:room])
                        advance(min(len(chunk), room))
                        if len(chunk) > room:
                            file.truncate(0)  # which bytes are wrong is unknown
                            advance(-size)
                            raise Oversized(
                                f"{local.name} came with more than the {size} bytes the "
                                "hub lists for it; none of it was kept"
                            )
            except (HfHubHTTPError, Oversized, PullCancelled):
                raise
            except Exception:
                tries -= 1
                if tries <= 0:
                    raise
                continue
            if file.tell() != size:
                raise PullError(f"{local.name} came with {file.tell()} bytes, not {size}")
            return


class Oversized(PullError):
    """A file that came with more bytes than its listed size: stopped at that size (the
    free disk was checked for the listed sizes), and never taken as whole."""


SNAPSHOT_PATTERNS = [
    "*.json", "*.safetensors", "*.gguf", "*.txt", "*.model", "*.jinja", "*/*.json",
]  # fmt: skip


def download_snapshot(repo: str, sizes: dict[str, int], into: Path, progress: Progress) -> Path:
    """A snapshot of the repo's model files (weights as safetensors or GGUF, no pickles),
    free disk checked first."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import filter_repo_objects

    wanted = list(filter_repo_objects(list(sizes), allow_patterns=SNAPSHOT_PATTERNS))
    into.mkdir(parents=True, exist_ok=True)
    check_free_disk(sum(sizes[f] for f in wanted), free_bytes(into), into)
    progress.step(f"fetching {repo} from the Hugging Face hub ({len(wanted)} files)")
    try:
        folder = snapshot_download(repo, local_dir=into, allow_patterns=SNAPSHOT_PATTERNS)
    except Exception as exc:
        raise PullError(f"could not download {repo!r} from the Hugging Face hub: {exc}") from exc
    return Path(folder)
