"""What serving's commands share about their flags: one-line errors and the number checks.

The prediction image carries serving/ alone, so serving cannot use trainer.cli; this is the same
contract in a few lines. argparse prints its whole usage block before an error, and Cloud Logging
reads every stderr line of a container as ERROR: the one line that says what is wrong is all a
log needs.
"""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: the message, a pointer to --help, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def positive_int(text: str) -> int:
    """A flag type: a whole number >= 1 (also written "64.0"), else a one-line argparse error."""
    try:
        number = float(text)
        value = int(number)
        if value != number:
            raise ValueError
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def positive_float(text: str) -> float:
    """A flag type: a number > 0 (nan refused), else a one-line argparse error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value
