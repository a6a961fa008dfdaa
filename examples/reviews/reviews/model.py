"""A small transformer over words, written with Keras 3's `keras.ops`, and its export.

The model takes raw text: `TextVectorization` turns it into word ids (0 pads, 1 is a word outside
the vocabulary), a learned position embedding is added to each word's, `blocks` transformer
blocks read the words in context, and a masked mean over the words feeds a sigmoid: the
probability that the review is positive.

The attention is written out with `keras.ops` (einsum, softmax, where), the backend-agnostic
operations Keras 3 introduced: the same layer runs on TensorFlow, JAX or PyTorch. Under a mixed
precision policy the scores and their softmax are computed in float32, the rest in the policy's
compute dtype.
"""

from __future__ import annotations

from typing import Sequence

import keras
from keras import ops

from reviews import data


@keras.saving.register_keras_serializable(package="reviews")
class PositionalEmbedding(keras.layers.Layer):
    """Word ids [batch, length] -> each word's embedding plus its position's."""

    def __init__(self, vocabulary_size: int, length: int, dim: int, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size, self.length, self.dim = vocabulary_size, length, dim
        self.words = keras.layers.Embedding(vocabulary_size, dim, name="words")

    def build(self, input_shape):
        self.words.build(input_shape)
        self.positions = self.add_weight(shape=(self.length, self.dim), initializer="random_normal", name="positions")

    def call(self, ids):
        return self.words(ids) + ops.cast(self.positions, self.compute_dtype)[None, : ops.shape(ids)[1]]

    def get_config(self):
        return {**super().get_config(), "vocabulary_size": self.vocabulary_size, "length": self.length, "dim": self.dim}


@keras.saving.register_keras_serializable(package="reviews")
class SelfAttention(keras.layers.Layer):
    """Multi-head self-attention over the words a mask keeps (padding is left out)."""

    def __init__(self, heads: int, **kwargs):
        super().__init__(**kwargs)
        self.heads = heads

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim % self.heads:
            raise ValueError(f"the embedding size {dim} must be a multiple of the heads, {self.heads}")
        self.query_key_value = self.add_weight(shape=(dim, 3 * dim), initializer="glorot_uniform", name="qkv")
        self.output_weights = self.add_weight(shape=(dim, dim), initializer="glorot_uniform", name="output")

    def call(self, x, mask):
        batch, length, dim = ops.shape(x)[0], ops.shape(x)[1], x.shape[-1]
        per_head = dim // self.heads
        qkv = ops.matmul(x, ops.cast(self.query_key_value, x.dtype))
        query, key, value = (ops.reshape(part, (batch, length, self.heads, per_head)) for part in ops.split(qkv, 3, axis=-1))
        scores = ops.einsum("bqhd,bkhd->bhqk", ops.cast(query, "float32"), ops.cast(key, "float32")) / per_head ** 0.5
        scores = ops.where(mask[:, None, None, :], scores, -1e9)
        weights = ops.cast(ops.softmax(scores, axis=-1), x.dtype)
        attended = ops.reshape(ops.einsum("bhqk,bkhd->bqhd", weights, value), (batch, length, dim))
        return ops.matmul(attended, ops.cast(self.output_weights, x.dtype))

    def get_config(self):
        return {**super().get_config(), "heads": self.heads}


@keras.saving.register_keras_serializable(package="reviews")
class TransformerBlock(keras.layers.Layer):
    """Attention, then a two-layer MLP, each with a residual connection and layer norm."""

    def __init__(self, heads: int, hidden: int, dropout: float = 0.1, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.heads, self.hidden, self.dropout, self.seed = heads, hidden, dropout, seed
        self.attention = SelfAttention(heads, name="attention")
        self.first_norm = keras.layers.LayerNormalization(name="first_norm")
        self.second_norm = keras.layers.LayerNormalization(name="second_norm")
        self.drop = keras.layers.Dropout(dropout, seed=seed)

    def build(self, input_shape):
        dim = input_shape[-1]
        self.attention.build(input_shape)
        self.first_norm.build(input_shape)
        self.second_norm.build(input_shape)
        self.expand = keras.layers.Dense(self.hidden, activation="gelu", name="expand")
        self.expand.build(input_shape)
        self.project = keras.layers.Dense(dim, name="project")
        self.project.build((*input_shape[:-1], self.hidden))

    def call(self, x, mask, training=None):
        x = self.first_norm(x + self.drop(self.attention(x, mask), training=training))
        return self.second_norm(x + self.drop(self.project(self.expand(x)), training=training))

    def get_config(self):
        return {**super().get_config(), "heads": self.heads, "hidden": self.hidden, "dropout": self.dropout,
                "seed": self.seed}


def build(vocabulary: Sequence[str], length: int, dim: int, heads: int, blocks: int, seed: int) -> keras.Model:
    text = keras.Input(shape=(), dtype="string", name="text")
    ids = keras.layers.TextVectorization(vocabulary=list(vocabulary), output_sequence_length=length,
                                         name="words_to_ids")(text)
    mask = ops.not_equal(ids, 0)
    x = PositionalEmbedding(len(vocabulary) + data.RESERVED_TOKENS, length, dim, name="embedding")(ids)
    for index in range(blocks):
        x = TransformerBlock(heads, 2 * dim, seed=seed + index, name=f"block_{index}")(x, mask)
    weights = ops.expand_dims(ops.cast(mask, x.dtype), -1)
    pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    # float32 output even under mixed precision, for a numerically stable loss.
    positive = keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="positive")(pooled)
    return keras.Model(text, positive, name="reviews")


def save(model: keras.Model, path: str) -> None:
    """A SavedModel whose serving_default takes `text` (strings) and answers `probability` (that
    the review is positive) and `label` (its class name)."""
    import tensorflow as tf

    names = tf.constant(list(data.CLASS_NAMES))

    # Traced as written, as Keras' own export does: TensorFlow ops, nothing for AutoGraph to convert.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
    def serve(text):
        probability = tf.squeeze(tf.cast(model(text, training=False), tf.float32), -1)
        return {"probability": probability, "label": tf.gather(names, tf.cast(probability > 0.5, tf.int32))}

    from trainer import export

    export.write(path, model, {"serving_default": serve})  # each weight stored once
