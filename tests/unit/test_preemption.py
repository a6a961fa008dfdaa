"""trainer.preemption's arithmetic: where tf-keras resumes, and how often auto backs up."""

import pytest

from trainer import preemption


@pytest.mark.parametrize("saved, resume", [((0, 49), (1, 50)), ((1, 0), (2, 1)), ((1, 149), (3, 0)), ((2, 10), (3, 11))])
def test_resume_point_is_the_step_after_the_backup(saved, resume):
    assert preemption.resume_point(*saved, steps_per_epoch=150) == resume


def test_auto_backups_cost_about_two_percent_and_come_at_least_a_minute_apart():
    assert preemption.backup_interval(None) == 60.0  # before the first backup has been timed
    assert preemption.backup_interval(0.5) == 60.0
    assert preemption.backup_interval(3.0) == pytest.approx(150.0)  # 3 s to Cloud Storage: 2.5 min apart


def test_only_auto_mode_asks_for_backups_and_only_once_the_interval_has_passed(monkeypatch, tmp_path):
    clock = [1000.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    auto = preemption.StepBackup(str(tmp_path), None, 150, is_chief=True)
    fixed = preemption.StepBackup(str(tmp_path), 20, 150, is_chief=True)
    clock[0] += 59
    assert not auto.backup_due()
    clock[0] += 2
    assert auto.backup_due() and not fixed.backup_due()  # a fixed N leaves it to tf-keras' counter
    auto.last_seconds, auto.finished_at = 4.0, clock[0]  # a 4 s backup: next one 200 s later
    clock[0] += 199
    assert not auto.backup_due()
    clock[0] += 1
    assert auto.backup_due()
