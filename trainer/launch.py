"""`python -m trainer.launch --replicas N -- COMMAND`: a whole multi-worker job on this machine.

The documented command's path; the code is trainer/process/launch.py."""

import sys

from trainer.process.launch import main

if __name__ == "__main__":
    sys.exit(main())
