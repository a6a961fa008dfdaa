"""What every command's flags share: one-line errors and the number checks.

argparse prints its whole usage block before an error, forty lines for the trainer. In a job's
log, where a platform reads every stderr line as an error and prints a restarted replica's again,
that buries the one line that says what is wrong. So every parser of the project is a
`OneLineParser`: the error, a pointer to --help, exit 2.
"""

from __future__ import annotations

import argparse
from typing import Callable


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: the message, a pointer to --help, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def whole_number(text: str) -> int:
    """An integer, also written as a float without a fraction: tuning services may pass a discrete
    value as "64.0"."""
    try:
        number = float(text)
        value = int(number)
        if value != number:
            raise ValueError
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """A flag type: a whole number >= `minimum`."""

    def parse(text: str) -> int:
        value = whole_number(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be positive, got {value}" if minimum == 1 else f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = "positive_int" if minimum == 1 else f"int_at_least_{minimum}"
    parse.__doc__ = f"A flag type: a whole number >= {minimum} (`whole_number`), else a one-line argparse error."
    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)


def positive_float(text: str) -> float:
    """A flag type: a number > 0 (nan refused), else a one-line argparse error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def fraction(text: str) -> float:
    """A flag type: a number at least 0 and below 1 (a dropout rate, a momentum), nan refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value
