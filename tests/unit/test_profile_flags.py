"""--profile-steps and --profile-tasks, as trainer.runtime.config parses them (trainer.runtime.profiling traces)."""

import pytest

from cassava.task import CassavaTask
from trainer.runtime import config
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
