"""Constrained decoding: a row's tokens follow a JSON schema, so even a small model's
answer parses and validates.

The grammar engine is llguidance (Microsoft's, Rust, abi3 wheels for Windows, Linux and
macOS, no GPU compiler needed): a schema is compiled into a grammar when the request is
prepared (a feature it cannot enforce is a 400 before anything is queued); each row holds
its own matcher, which gives the tokens allowed next as a bitmask (~0.4 ms a token for
SmolLM2's 49k vocabulary on this project's CPU runner, against ~40 ms for the forward)
and follows the tokens sampled. Whitespace between JSON tokens is not free: a small
model left to choose it can emit newlines until `max_tokens`.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from app.errors import InvalidRequest
from app.models.structured import json_grammar


class Grammars:
    """One model's grammar compiler: llguidance's view of its tokenizer, built on first
    use (~0.2 s for a 49k vocabulary)."""

    def __init__(self, tokenizer: Any, vocab: int, eos: set[int]) -> None:
        """`vocab`: the model's logits. A tokenizer may know a few more tokens than that
        (added special tokens past the embeddings: transformers 5.0 converting SmolLM2's
        GGUF gave 49,157 against 49,152), which llguidance refuses to size below; it
        sees the larger, and the mask is cut to the logits (those tokens are never
        sampled)."""
        self._hf = tokenizer
        self._vocab = vocab
        self._engine_vocab = max(vocab, len(tokenizer))
        self._eos = sorted(eos)
        self._llg: Any = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._llg is None:
                import llguidance.hf

                self._llg = llguidance.hf.from_tokenizer(
                    self._hf, n_vocab=self._engine_vocab, eos_token=self._eos or None
                )
            return self._llg

    def compile(self, schema: str) -> str:
        """The grammar of a JSON schema (JSON text); a 400 naming `response_format` for a
        schema the engine cannot enforce."""
        import llguidance

        try:
            grammar = json_grammar(schema)  # the same for every engine (app.models.structured)
            problem = llguidance.LLMatcher.validate_grammar(grammar, self._tokenizer())
        except (ValueError, TypeError) as exc:
            problem = str(exc)
        if problem and not problem.startswith("WARNING"):
            raise InvalidRequest(
                f"response_format: this JSON schema cannot be enforced: {problem}",
                param="response_format",
            )
        return grammar

    def constraint(self, grammar: str) -> Constraint:
        import llguidance

        matcher = llguidance.LLMatcher(self._tokenizer(), grammar)
        return Constraint(matcher, self._vocab, self._engine_vocab)


class Constraint:
    """A row's grammar state: what may come next, and the tokens that came."""

    def __init__(self, matcher: Any, vocab: int, engine_vocab: int | None = None) -> None:
        """`vocab`: the logits' width; `engine_vocab`: the matcher's (at least as wide)."""
        self._matcher = matcher
        self._vocab = vocab
        width = max(vocab, engine_vocab or vocab)
        self._words = torch.zeros((width + 31) // 32, dtype=torch.int32)
        self._shifts = torch.arange(32, dtype=torch.int32)

    def allowed(self) -> torch.Tensor:
        """A bool per token: whether the grammar allows it next."""
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        return ((words.unsqueeze(-1) >> self._shifts) & 1).flatten()[: self._vocab].bool()

    def accept(self, token: int) -> bool:
        """Follow a sampled token; False if the grammar refused it (it was allowed, so
        only a fault in the engine gets here)."""
        return bool(self._matcher.consume_token(token))

    @property
    def complete(self) -> bool:
        """The grammar is satisfied and allows nothing more: the answer ends here."""
        return bool(self._matcher.is_stopped())
