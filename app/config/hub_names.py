"""How a Hugging Face repo, and one GGUF quantisation of it, is spelled: `hf:ORG/NAME`,
Ollama's `hf.co/ORG/NAME:QUANT`, a bare `ORG/NAME`. `vramgate pull` reads a source so
(app.store.sources); the server reads a model name so, for a model pulled from the Hub
and asked for as Ollama's clients ask for it after `ollama pull hf.co/ORG/NAME:QUANT`
(app.core.fleet.names)."""

from __future__ import annotations

import re

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# a repo with an optional quantisation, as `hf:` and Ollama's `hf.co/` spell them
HUB_QUANT = re.compile(r"^(?P<repo>[^:]+)(?::(?P<quant>[A-Za-z0-9._-]{1,40}))?$")
HUB_PREFIXES = ("hf:", "hf.co/", "huggingface.co/", "https://huggingface.co/")


def hub_prefix(text: str) -> str | None:
    """The Hub prefix `text` starts with (any case), or None."""
    return next((p for p in HUB_PREFIXES if text.lower().startswith(p)), None)


def hub_reference(text: str) -> tuple[str, str | None] | None:
    """The repo and the quantisation `text` names (None: the repo's default one; Ollama's
    `:latest` says the same), or None where `text` names no Hub repo."""
    prefix = hub_prefix(text)
    match = HUB_QUANT.match(text[len(prefix) :] if prefix else text)
    if match is None or not HUB_ID.match(match["repo"]):
        return None
    quant = match["quant"]
    return match["repo"], None if quant in (None, "latest") else quant
