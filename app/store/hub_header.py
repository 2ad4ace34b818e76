"""A GGUF on the Hub read from its header alone, before anything is downloaded: its first
bytes fetched with an HTTP Range (1 MiB, then more as the header needs: a tokenizer's
tokens and merges make most headers 1-8 MiB), parsed by app.engines.gguf_header into the
facts the load planner reads. Each shard of a split GGUF lists its own tensors: each
shard's header is read. No file is fetched past its header."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from app.engines.gguf_facts import GgufFacts, header_facts
from app.engines.gguf_header import GgufHeader, HeaderIncomplete, read_header
from app.store.hub import file_url
from app.store.sources import PullError

FIRST_BYTES = 2**20  # the first request's bytes
MOST_BYTES = 64 * 2**20  # a header longer than this is no header a planner needs


def remote_facts(repo: str, commit: str, files: Sequence[tuple[str, int]]) -> tuple[GgufFacts, int]:
    """The facts of a GGUF of `repo` at `commit` (`files`: its file, or a split one's
    shards in order, each with the size the listing gives), read from its headers; and
    the bytes that took."""
    headers, fetched = [], 0
    for path, size in files:
        header, nbytes = remote_header(repo, commit, path, size)
        headers.append(header)
        fetched += nbytes
    tensors = [tensor for header in headers for tensor in header.tensors]
    total = sum(size for _, size in files)
    try:
        return header_facts(headers[0], tensors, total, PurePosixPath(files[0][0]).name), fetched
    except ValueError as exc:
        raise PullError(f"{repo}: {exc}") from exc


def remote_header(repo: str, commit: str, path: str, size: int) -> tuple[GgufHeader, int]:
    """The header of one file, and the bytes fetched for it: its first MiB, then as much
    again each time it proves longer."""
    from huggingface_hub import constants

    url = file_url(constants.ENDPOINT, repo, commit, path)
    data = b""
    wanted = min(FIRST_BYTES, size)
    while True:
        data += fetch_range(url, len(data), wanted)
        try:
            return read_header(data), len(data)
        except HeaderIncomplete as short:
            if len(data) >= size or len(data) >= MOST_BYTES:
                raise PullError(
                    f"{repo}/{path}: its GGUF header is cut short or too long"
                ) from None
            wanted = min(max(short.needed, 2 * len(data)), size, MOST_BYTES)
        except ValueError as exc:
            raise PullError(f"{repo}/{path}: {exc}") from exc


def fetch_range(url: str, start: int, end: int) -> bytes:
    """Bytes `start` to `end` (exclusive) of the file at `url`; a server that sends more
    than asked is read no further."""
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

    headers = build_hf_headers() | {"Range": f"bytes={start}-{end - 1}"}
    chunks, have = [], 0
    try:
        with http_stream_backoff("GET", url, headers=headers) as response:
            hf_raise_for_status(response)
            if response.status_code != 206 and start:  # the whole file from its start
                raise PullError(f"{url} answered a Range with the whole file")
            for chunk in response.iter_bytes():
                chunks.append(chunk[: end - start - have])
                have += len(chunks[-1])
                if have >= end - start:
                    break
    except PullError:
        raise
    except Exception as exc:
        raise PullError(f"could not read {url}'s header from the Hugging Face hub: {exc}") from exc
    return b"".join(chunks)
