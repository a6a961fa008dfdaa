"""trainer.library.backup's arithmetic: where a run resumes, and how often auto backs up."""

import pytest

from trainer.library import backup


@pytest.mark.parametrize("done, resume", [(0, (1, 0)), (49, (1, 49)), (150, (2, 0)), (151, (2, 1)), (449, (3, 149))])
def test_resume_point_is_the_step_after_the_last_one_done(done, resume):
    assert backup.resume_point(done, steps_per_epoch=150) == resume


def test_auto_backups_cost_about_two_percent_and_come_at_least_a_minute_apart():
    assert backup.backup_interval(None) == 60.0  # before the first backup has been timed
    assert backup.backup_interval(0.5) == 60.0
    assert backup.backup_interval(3.0) == pytest.approx(150.0)  # 3 s to Cloud Storage: 2.5 min apart


class _Model:
    optimizer = None


def test_auto_asks_once_the_interval_has_passed_and_a_fixed_n_counts_steps_since_the_last(tmp_path):
    clock = [1000.0]
    auto = backup.Backup(str(tmp_path), _Model(), 150, is_chief=True, every_steps=None, clock=lambda: clock[0])
    fixed = backup.Backup(str(tmp_path), _Model(), 150, is_chief=True, every_steps=20, clock=lambda: clock[0])
    per_epoch = backup.Backup(str(tmp_path), _Model(), 150, is_chief=True, every_steps=0, clock=lambda: clock[0])
    clock[0] += 59
    assert not auto.due(5)
    clock[0] += 2
    assert auto.due(5)
    auto.last_seconds, auto.finished_at = 4.0, clock[0]  # a 4 s backup: the next one 200 s later
    clock[0] += 199
    assert not auto.due(10)
    clock[0] += 1
    assert auto.due(10)
    # --backup-every-steps 20 with 8 steps per call of the train function: due at 24, then at 48.
    assert not fixed.due(16) and fixed.due(24)
    fixed.saved_at = 24
    assert not fixed.due(40) and fixed.due(48)
    assert not any(per_epoch.due(step) for step in (1, 20, 150))  # 0: at each epoch's end only
