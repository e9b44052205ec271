"""Models: a small CNN that trains in seconds on CPU, and torchvision classifiers by name."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two conv layers and a linear head; works for any input size (adaptive pooling)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width * 2, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4))
        self.head = nn.Linear(width * 2 * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def build(name: str, in_channels: int, num_classes: int) -> nn.Module:
    if name == "smallcnn":
        return SmallCNN(in_channels, num_classes)
    from torchvision import models  # only ranks that need it pay for the import

    if name not in models.list_models(module=models):
        raise ValueError(f"unknown model {name!r}: use smallcnn or a torchvision classifier such as resnet18")
    model = models.get_model(name, weights=None, num_classes=num_classes)
    if in_channels != 3:
        first = _first_conv(model)
        if first is not None:
            parent, attr, conv = first
            size, stride, padding = (cast(tuple[int, int], v) for v in (conv.kernel_size, conv.stride, conv.padding))
            setattr(parent, attr, nn.Conv2d(in_channels, conv.out_channels, size, stride, padding,
                                            bias=conv.bias is not None))
    return model


def _first_conv(model: nn.Module) -> tuple[nn.Module, str, nn.Conv2d] | None:
    for parent in model.modules():
        for attr, child in parent.named_children():
            if isinstance(child, nn.Conv2d):
                return parent, attr, child
    return None
