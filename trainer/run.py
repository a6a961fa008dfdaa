"""`python -m trainer.run [--log-format ...] -- COMMAND`: your own command under the runtime.

The documented command's path; the code is trainer/process/command.py."""

import sys

from trainer.process.command import main

if __name__ == "__main__":
    sys.exit(main())
