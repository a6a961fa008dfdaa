"""`python -m trainer.selfcheck`: proves an image on the machine it runs on (the images' default
command). The documented command's path; the code is trainer/checks/selfcheck.py."""

import sys

from trainer.checks.selfcheck import main

if __name__ == "__main__":
    sys.exit(main())
