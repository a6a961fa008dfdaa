"""Keras 3 layers the runtime offers for speed on TensorFlow.

Keras 3's `BatchNormalization` runs unfused on TensorFlow and in float32 whatever the policy:
it casts a bfloat16 or float16 input up, computes the batch's moments and the normalization with
several elementwise ops over the whole activation, and the next layer casts back. Over a ResNet50
(53 such layers) that cost most of mixed precision's gain: a ResNet50 train step at 160 px,
batch 16, mixed_bfloat16, ran at 16.7 images/s in Keras 3's `fit` and 40.1 in tf-keras' `fit`,
whose layer calls TensorFlow's fused kernel (FusedBatchNormV3) on the bfloat16 input (AMD EPYC
family 26 model 2, 2 cores, a busy machine). In one process, rounds interleaved, CPU seconds per
image: tf-keras 0.0463, Keras 3 0.0713, Keras 3 with this layer 0.0462 (benchmarks/train_step.py
puts the trainer's model, which uses it, beside tf-keras `fit`).

`FusedBatchNormalization` is Keras 3's layer with the fused kernel where it applies (4-D input,
channels last, no mask, no renormalization, not synchronized); anywhere else it is Keras' own.
Its variables, their names and its config are Keras' own too, so a checkpoint reads into either.
It keeps Keras 3's moving variance (the batch's biased variance; the kernel returns the unbiased
one, which is corrected back). `fuse_batch_norm(model)` swaps it in for every BatchNormalization
of a functional or sequential model, nested models included, weights kept.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="trainer")
class FusedBatchNormalization(keras.layers.BatchNormalization):
    """keras.layers.BatchNormalization on TensorFlow's fused kernel, in the layer's compute dtype."""

    def _fusable(self, inputs, mask) -> bool:
        return (mask is None and not self.renorm and not getattr(self, "synchronized", False)
                and len(inputs.shape) == 4 and self.axis in (3, -1))

    def call(self, inputs, training=None, mask=None):
        if not self._fusable(inputs, mask):
            return super().call(inputs, training=training, mask=mask)
        channels = inputs.shape[-1]
        scale = self.gamma.value if self.scale else tf.ones([channels], tf.float32)
        offset = self.beta.value if self.center else tf.zeros([channels], tf.float32)
        if training and self.trainable:
            outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
                inputs, scale, offset, epsilon=self.epsilon, data_format="NHWC", is_training=True)
            count = tf.cast(tf.size(inputs) // channels, tf.float32)
            variance = variance * (count - 1.0) / tf.maximum(count, 1.0)  # the kernel's is unbiased
            self.moving_mean.assign(self.moving_mean * self.momentum + mean * (1.0 - self.momentum))
            self.moving_variance.assign(self.moving_variance * self.momentum + variance * (1.0 - self.momentum))
            return outputs
        outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
            inputs, scale, offset, mean=self.moving_mean.value, variance=self.moving_variance.value,
            epsilon=self.epsilon, data_format="NHWC", is_training=False)
        return outputs


def _fused(layer):
    if type(layer) is keras.layers.BatchNormalization:
        return FusedBatchNormalization.from_config(layer.get_config())
    return layer.__class__.from_config(layer.get_config())


def fuse_batch_norm(model: keras.Model) -> keras.Model:
    """A copy of `model` (functional or sequential, nested models included) with every
    BatchNormalization a FusedBatchNormalization, and the same weights."""
    fused = keras.models.clone_model(model, clone_function=_fused, recursive=True)
    fused.set_weights(model.get_weights())
    return fused
