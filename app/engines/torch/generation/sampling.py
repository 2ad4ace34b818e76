"""Choosing a row's next token from its logits, with the row's own parameters and seeded
generator (so its text does not depend on who shares its batch).

The order is vLLM's: logit bias, then the repetition penalty (HF's: every token of the
prompt and the answer so far, a positive logit divided by it and a negative one
multiplied), then OpenAI's frequency and presence penalties (on the answer so far:
minus count × frequency, minus presence once a token appeared); greedy at temperature 0;
otherwise temperature, then top-k, top-p (nucleus) and min-p, then a draw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from app.models.decoding import SamplingParams, TokenLogprob


def adjusted(
    logits: torch.Tensor,
    params: SamplingParams,
    produced: Sequence[int] = (),
    prompt: Sequence[int] = (),
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits (as floats, on the CPU) after bias and penalties, and with every token
    a grammar does not allow (`allowed` False) at minus infinity. Out of place: the
    model's own logits are never changed, and an unadjusted row costs no copy."""
    logits = logits.float().cpu()
    vocab = logits.shape[-1]
    if params.logit_bias:
        ids = torch.tensor([i for i, _ in params.logit_bias if 0 <= i < vocab], dtype=torch.long)
        bias = torch.tensor([b for i, b in params.logit_bias if 0 <= i < vocab])
        logits = logits.index_add(0, ids, bias)
    if params.repetition_penalty != 1.0 and (produced or prompt):
        seen = torch.tensor(sorted({*prompt, *produced}), dtype=torch.long)
        seen = seen[seen < vocab]
        values = logits[seen]
        penalty = params.repetition_penalty
        penalised = torch.where(values > 0, values / penalty, values * penalty)
        logits = logits.index_put((seen,), penalised)
    if (params.frequency_penalty or params.presence_penalty) and produced:
        counts = torch.bincount(torch.tensor(list(produced), dtype=torch.long), minlength=vocab)
        counts = counts[:vocab].float()
        logits = logits - (
            params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
        )
    if allowed is not None:
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[: min(vocab, allowed.shape[0])] = allowed[:vocab]
        logits = logits.masked_fill(~keep, float("-inf"))
    return logits


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    produced: Sequence[int] = (),
    prompt: Sequence[int] = (),
    allowed: torch.Tensor | None = None,
) -> int:
    logits = adjusted(logits, params, produced, prompt, allowed)
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if 0 < params.top_k < probs.shape[-1]:
        keep &= probs >= torch.topk(probs, params.top_k).values[-1]
    if params.top_p < 1.0:
        ordered, index = torch.sort(probs, descending=True)
        inside = torch.cumsum(ordered, dim=-1) - ordered < params.top_p
        inside[0] = True
        keep &= torch.zeros_like(keep).scatter(0, index, inside)
    if params.min_p > 0:
        keep &= probs >= params.min_p * probs.max()
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(
    logits: torch.Tensor, token: int, top: int, decode: Callable[[list[int]], str]
) -> TokenLogprob:
    """`token`'s log-probability under the model's own `logits`, and the `top` likeliest."""
    logprobs = torch.log_softmax(logits.float().cpu(), dim=-1)
    best = torch.topk(logprobs, top) if top else None
    alternatives = (
        tuple((decode([int(i)]), float(v)) for v, i in zip(best.values, best.indices, strict=True))
        if best is not None
        else ()
    )
    return TokenLogprob(decode([token]), float(logprobs[token]), alternatives)
