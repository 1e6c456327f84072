"""Registered architectures. Importing this package registers every builder."""

from . import resnet_cifar, resnet_imagenet, transformer, wide_resnet
from ._drop_path import DropPath, drop_path_rates
from ._registry import create_model, list_models, register_model

__all__ = [
    "DropPath",
    "create_model",
    "drop_path_rates",
    "list_models",
    "register_model",
    "resnet_cifar",
    "resnet_imagenet",
    "transformer",
    "wide_resnet",
]
