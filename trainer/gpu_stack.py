"""`python -m trainer.gpu_stack`: the CUDA stack TensorFlow will load here, checked (the GPU image
runs it at build time). The documented command's path; the code is trainer/checks/gpu_stack.py."""

import sys

from trainer.checks.gpu_stack import main

if __name__ == "__main__":
    sys.exit(main())
