"""A Keras 3 model's serving functions as a SavedModel, each weight stored once: the public name
of trainer/library/export.py."""

from trainer.library.export import write

__all__ = ["write"]
