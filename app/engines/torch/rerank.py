"""Reranking with a cross-encoder: a sentence-transformers CrossEncoder folder (a
transformers sequence-classification model with one label, and its tokenizer).

Each (query, document) pair is encoded together, as CrossEncoder encodes it (the
tokenizer's pair encoding, segment ids included, truncated longest-first to the model's
length), scored by the model, and passed through the model's activation: the one its
folder names (`activation_fn` in config_sentence_transformers.json or config.json),
else a sigmoid for one label, as CrossEncoder does. Pairs are bucketed by (longest pair
× pairs), sorted by length and run in chunks of `max_batch`, like embeddings, so
concurrent rerank requests batch.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from app.config.settings import ModelSpec
from app.devices.base import Device
from app.devices.torch_backed import torch_device_of
from app.engines.torch.module import TorchModule
from app.models.base import dtype_on, read_json_object, weight_file_bytes
from app.models.kinds import Pair, Reranker
from app.models.prepared import Prepared, length_bucketed, merged_rows
from app.models.stages import InThreads

ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.modules.linear.Identity": lambda x: x,
}


class RerankHandler(InThreads, TorchModule, Reranker):
    kind = "rerank"

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        if spec.path is None:
            raise ValueError(f"rerank model {spec.name!r} needs a path (a CrossEncoder folder)")
        self.path = Path(spec.path)
        self._model: Any = None
        self._tokenizer: Any = None
        self._device = torch.device("cpu")
        self._activation: Any = torch.sigmoid
        self._max_seq = 512
        self._segments = True

    def expected_weights_bytes(self, device: Device) -> int:
        dtype = dtype_on(device, self.spec.dtype)
        return weight_file_bytes(self.path, torch.finfo(getattr(torch, dtype)).bits // 8)

    def load(self, device: Device) -> None:
        if not self.path.is_dir():
            raise FileNotFoundError(f"model folder {self.path} does not exist")
        self.dtype = dtype_on(device, self.spec.dtype)
        self._tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(
            self.path, local_files_only=True, dtype=getattr(torch, self.dtype), use_safetensors=True
        )
        self._model = model.to(torch_device_of(device)).eval()
        self._device = torch_device_of(device)
        self._activation = self._activation_of(int(model.config.num_labels))
        self._max_seq = min(512, int(self._tokenizer.model_max_length or 512))
        self._segments = "token_type_ids" in self._tokenizer.model_input_names

    def _activation_of(self, labels: int) -> Any:
        own = read_json_object(self.path / "config_sentence_transformers.json")
        config = read_json_object(self.path / "config.json").get("sentence_transformers", {})
        named = own.get("activation_fn") or config.get("activation_fn")
        if named is not None:
            if named not in ACTIVATIONS:
                raise ValueError(f"{self.path}: activation {named!r} is not one vramgate knows")
            return ACTIVATIONS[named]
        one = "torch.nn.modules.activation.Sigmoid"
        return ACTIVATIONS[one if labels == 1 else "torch.nn.modules.linear.Identity"]

    def torch_module(self) -> Any:
        return self._model

    def unload(self) -> None:
        self._model = None
        self._tokenizer = None
        gc.collect()

    def preprocess(self, inputs: list[Pair]) -> Prepared:
        queries = [query for query, _ in inputs]
        documents = [document for _, document in inputs]
        encoded = self._tokenizer(
            queries, documents, truncation="longest_first", max_length=self._max_seq
        )
        types = encoded.get("token_type_ids") or [[0] * len(ids) for ids in encoded["input_ids"]]
        return self._prepared(list(zip(encoded["input_ids"], types, strict=True)))

    def _prepared(self, rows: list[tuple[list[int], list[int]]]) -> Prepared:
        return length_bucketed(rows, [len(ids) for ids, _ in rows], self.spec.max_batch)

    def merge(self, parts: list[Prepared]) -> Prepared | None:
        return merged_rows(parts, self.spec.max_batch, self._prepared)

    def forward(self, prepared: Prepared) -> Any:
        self.forward_calls += 1
        rows: list[tuple[list[int], list[int]]] = prepared.payload
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        scores = np.empty(len(rows), dtype=np.float32)
        pad = int(self._tokenizer.pad_token_id or 0)
        with torch.inference_mode():
            for start in range(0, len(order), self.spec.max_batch):
                members = order[start : start + self.spec.max_batch]
                width = max(len(rows[i][0]) for i in members)
                ids = torch.full((len(members), width), pad, dtype=torch.long)
                types = torch.zeros((len(members), width), dtype=torch.long)
                mask = torch.zeros((len(members), width), dtype=torch.long)
                for row, i in enumerate(members):
                    length = len(rows[i][0])
                    ids[row, :length] = torch.tensor(rows[i][0])
                    types[row, :length] = torch.tensor(rows[i][1])
                    mask[row, :length] = 1
                given = {"input_ids": ids, "attention_mask": mask}
                if self._segments:  # BERT's segment ids; RoBERTa-like models take none
                    given["token_type_ids"] = types
                inputs = {name: tensor.to(self._device) for name, tensor in given.items()}
                logits = self._model(**inputs).logits
                scores[members] = self._activation(logits.float())[:, 0].cpu().numpy()
        return scores

    def postprocess(self, raw: Any) -> np.ndarray:
        return raw
