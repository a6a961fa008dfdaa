"""Keras 3 layers the runtime offers for speed on TensorFlow: the public names of
trainer/library/layers.py."""

from trainer.library.layers import FusedBatchNormalization, fuse_batch_norm

__all__ = ["FusedBatchNormalization", "fuse_batch_norm"]
