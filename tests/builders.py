"""Builders for worker tests, referenced from test catalogs as `tests.builders:<function>`."""

from __future__ import annotations

import torch
from torch import nn

from gpu_worker.demo_models import build_mlp


class WithBuffer(nn.Module):
    """An MLP plus a non-persistent buffer: state the weights file does not carry, made by the builder."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = build_mlp(in_features=64, hidden=128, depth=2, classes=10)
        self.register_buffer("scale", torch.full((10,), 2.0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) * self.scale


def build_with_buffer() -> nn.Module:
    return WithBuffer()


class Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = build_mlp(in_features=64, hidden=128, depth=2, classes=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            raise RuntimeError(f"batch of {x.shape[0]} is not supported")
        return self.mlp(x)


def build_exploding() -> nn.Module:
    """Loads fine (the tiny-mlp weights); fails on its second warmup input."""
    return Exploding()


def build_not_a_module() -> object:
    return {"not": "a module"}
