"""`python -m trainer.run [--log-format ...] -- COMMAND`: your own command under the runtime.

The documented command's path; the code is trainer/process/command.py. Also its one public name,
`child_environment`: the environment the command gets (TF_CONFIG resolved, the AIP_* directories),
for code that must start where trainer.run cannot wrap it (docs/kubernetes.md's Kubeflow SDK
function)."""

import sys

from trainer.process.command import child_environment, main

__all__ = ["child_environment", "main"]

if __name__ == "__main__":
    sys.exit(main())
