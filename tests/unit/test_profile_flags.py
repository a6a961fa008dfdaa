"""--profile-steps and --profile-tasks, as trainer.config parses them (trainer.profiling traces)."""

import subprocess
import sys

import pytest

from helpers import REPO, clean_env
from cassava.task import CassavaTask
from trainer import config
from trainer.cluster import resolve


@pytest.mark.parametrize("text, steps", [("10-15", (10, 15)), ("7", (7, 7)), (" 3 - 4 ", (3, 4)), ("1-1", (1, 1))])
def test_profile_steps_are_a_range_counted_from_one(text, steps):
    assert config.parse_profile_steps(text) == steps


@pytest.mark.parametrize("text", ["0-3", "5-4", "a-b", "3-", "-3", "1,2", ""])
def test_a_profile_range_that_cannot_be_one_is_refused(text):
    with pytest.raises(Exception, match="FIRST-LAST"):
        config.parse_profile_steps(text)


def test_profiling_is_off_by_default_and_on_the_chief_when_asked():
    cluster = resolve({})
    assert config.parse([], {}, cluster, CassavaTask()).profile_steps is None
    parsed = config.parse(["--profile-steps", "10-15"], {}, cluster, CassavaTask())
    assert (parsed.profile_steps, parsed.profile_tasks) == ((10, 15), "chief")
    assert config.parse(["--profile-steps", "2", "--profile-tasks", "all"], {}, cluster, CassavaTask()).profile_tasks == "all"


def test_parsing_the_flags_does_not_load_tensorflow():
    """cassava.task parses its flags before it hands stderr to the relay that filters
    TensorFlow's load-time lines (trainer.relay): loading TensorFlow earlier would print them."""
    code = ("import sys, cassava.task, trainer.fit; "
            "trainer.fit.build_parser(cassava.task.CassavaTask()).parse_args(['--epochs', '1']); "
            "print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code],
                            cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
