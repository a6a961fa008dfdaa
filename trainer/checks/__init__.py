"""Checks an image runs on the machine it is on: `python -m trainer.selfcheck` (selfcheck.py)
and `python -m trainer.gpu_stack`, the CUDA stack TensorFlow will load (gpu_stack.py)."""
