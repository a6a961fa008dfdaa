"""A small transformer that tells positive reviews from negative ones: a Keras 3 example whose
layers are written with `keras.ops`, trained multi-worker by the runtime (trainer/)."""
