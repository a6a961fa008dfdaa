"""The training loop's public names: `Steps` and `fit` train a compiled Keras 3 model under any
tf.distribute strategy, and `fit_model` is `model.fit` for a script of your own (docs/keras.md).
The code is trainer/library/."""

from trainer.library.loop import Events, Steps, fit, fit_model

__all__ = ["Events", "Steps", "fit", "fit_model"]
