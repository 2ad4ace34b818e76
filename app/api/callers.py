"""Who is calling, as far as the server can tell callers apart: the client's address, the
credential it sends, and the ids its request names (OpenAI's `user`, `prompt_cache_key`
and `safety_identifier`; Anthropic's `metadata.user_id`).

The prefix cache is scoped by it (`cache_scope`): a prompt reuses only the prefixes its
own caller's earlier prompts left, so `cached_tokens` (and the time a prefill takes)
tells a caller nothing of anyone else's prompts. Callers that send none of these, from
one address, are one caller: on a single-user desktop, that is its user's programs
sharing their cached prefixes (SECURITY.md).
"""

from __future__ import annotations

import hashlib

from starlette.requests import Request

MAX_CALLER_ID = 512  # characters of a `user`-like id


def client_address(request: Request) -> str:
    """The client's address ("" where the server does not know it)."""
    return request.client.host if request.client is not None else ""


def cache_scope(request: Request, *ids: str | None) -> str:
    """The prefix cache's scope of a request: a digest of its address, its credential
    (`Authorization`, or Anthropic's `x-api-key`) and the caller ids it names (None:
    not sent). The same caller always gets the same scope; the credential itself is
    not kept."""
    parts = [
        client_address(request),
        request.headers.get("authorization", ""),
        request.headers.get("x-api-key", ""),
        *(value or "" for value in ids),
    ]
    digest = hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:32]
