"""What one forward of a model costs on its device: seconds ≈ fixed + per_token × tokens,
fitted from the model's own forwards (least squares, older forwards weighing less).

The batcher asks it one question: is computing a shared prompt prefix once, and the rest
of the rows one forward later, cheaper than computing the prefix again for each row now?
On a CPU every token costs its share (~1.5 ms for a 135M model on two cores, against
~35 ms a forward), so a shared system prompt is worth the extra forward; on a GPU a few
hundred more tokens cost almost nothing, and it is not.
"""

from __future__ import annotations

DECAY = 0.98  # weight of the previous fit per new forward (~50 forwards remembered)


class ForwardCost:
    def __init__(self, decay: float = DECAY) -> None:
        self._decay = decay
        self._w = self._n = self._nn = self._t = self._nt = 0.0  # weighted sums
        self._seen = 0

    def record(self, tokens: int, seconds: float) -> None:
        d = self._decay
        self._seen += 1
        self._w = self._w * d + 1.0
        self._n = self._n * d + tokens
        self._nn = self._nn * d + tokens * tokens
        self._t = self._t * d + seconds
        self._nt = self._nt * d + tokens * seconds

    def fit(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token), or None until forwards of different sizes
        were seen."""
        spread = self._w * self._nn - self._n * self._n
        if self._seen < 2 or spread <= 1e-9 * max(self._w * self._nn, 1.0):
            return None
        per_token = max((self._w * self._nt - self._n * self._t) / spread, 0.0)
        fixed = max((self._t - per_token * self._n) / self._w, 0.0)
        return fixed, per_token

    def worth_splitting(self, saved_tokens: int) -> bool:
        """Whether `saved_tokens` fewer tokens outweigh one more forward. False until
        measured: then rows are prefilled together, as before anything was known."""
        fit = self.fit()
        return fit is not None and fit[1] * saved_tokens > fit[0]
