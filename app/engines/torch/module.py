"""What the torch engine's handlers share: their weights are a torch module, counted by
its parameters and buffers."""

from __future__ import annotations

from typing import Any

from app.models.base import ModelHandler


class TorchModule(ModelHandler):
    def torch_module(self) -> Any:
        """The loaded torch module (None when unloaded)."""
        return None

    def weights_bytes(self) -> int:
        """Bytes of the loaded weights (parameters and buffers); 0 when unloaded."""
        module = self.torch_module()
        if module is None:
            return 0
        tensors = [*module.parameters(), *module.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)
