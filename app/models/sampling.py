"""Choosing a row's next token from its logits, with the row's own parameters and seeded
generator (so its text does not depend on who shares its batch)."""

from __future__ import annotations

import torch

from app.models.decoding import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Greedy at temperature 0; otherwise temperature, then nucleus (top_p) sampling."""
    logits = logits.float().cpu()
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        ordered, index = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < params.top_p
        keep[0] = True
        probs = torch.zeros_like(probs).scatter(0, index[keep], ordered[keep])
    return int(torch.multinomial(probs, 1, generator=generator))
