"""Registered architectures. Importing this package registers every builder."""

from . import resnet_cifar, resnet_imagenet, transformer, wide_resnet
from ._registry import create_model, list_models, register_model

__all__ = [
    "create_model",
    "list_models",
    "register_model",
    "resnet_cifar",
    "resnet_imagenet",
    "transformer",
    "wide_resnet",
]
