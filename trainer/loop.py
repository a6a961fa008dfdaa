"""The training loop's public names: `Steps` and `fit` train a compiled Keras 3 model under any
tf.distribute strategy (trainer/library/loop.py, a file that can be copied on its own), and
`fit_model` is `model.fit` for a script of your own (trainer/library/fit_model.py, docs/keras.md)."""

from trainer.library.fit_model import fit_model
from trainer.library.loop import Events, Steps, fit

__all__ = ["Events", "Steps", "fit", "fit_model"]
