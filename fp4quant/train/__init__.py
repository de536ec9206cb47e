"""Tensor-parallel training of Qwen2 with compressed TP communication (`python -m fp4quant.train`)."""

from .train_config import ConfigError, TrainConfig
from .loop import Trainer, TrainingDiverged, lr_at

__all__ = ["ConfigError", "TrainConfig", "Trainer", "TrainingDiverged", "lr_at"]
