"""trainer.launch's counts, named for what they count: --workers the workers besides the chief (as
submit_job.py counts them), --replicas a MultiWorkerMirrored job's processes, chief included; and
its report of a ParameterServer job's servers stopped once training was done."""

from __future__ import annotations


import pytest

from trainer.process import launch


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "2", "--ps", "1", "--", "true"],
     "--replicas counts a MultiWorkerMirrored job; with --ps give --workers 2, the workers besides the chief"),
    (["--replicas", "2", "--workers", "1", "--", "true"], "argument --workers: not allowed with argument --replicas"),
    (["--", "true"], "one of the arguments --replicas --workers is required"),
    (["--replicas", "0", "--", "true"], "argument --replicas: must be positive, got 0"),
])
def test_a_count_that_does_not_say_one_thing_is_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        launch.main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"python -m trainer.launch: error: {message} (--help lists the flags)"]


def test_the_workers_flag_of_submit_job_counts_what_the_launchers_does():
    from scripts import submit_job

    help_text = " ".join(submit_job.build_parser().format_help().split())
    assert "the workers besides the chief (worker pool 1; TF_CONFIG's worker list), in both strategies" in help_text
    launch_help = " ".join(launch.build_parser().format_help().split())
    assert "with --ps: the workers besides the chief, as submit_job.py's --workers counts them" in launch_help
    # The same job: --replicas N locally, --workers N-1 on a platform.
    cluster, _ = launch.plan_cluster(2, 0, False, [1, 2])
    assert {kind: len(hosts) for kind, hosts in cluster.items()} == {"chief": 1, "worker": 1}


class Ended:
    """A finished task as Job's report reads it."""

    def __init__(self, returncode: int):
        self.returncode = returncode


@pytest.mark.parametrize("name, returncode, stopped_when_done, shown", [
    ("worker-0", -15, True, "stopped"),  # SIGTERM once training was done: how such a job ends everywhere
    ("ps-0", 0, True, "stopped"),
    ("ps-0", -9, True, "137"),  # it ignored the SIGTERM: killed after the grace period
    ("worker-0", -15, False, "143"),  # stopped for another reason
    ("chief-0", 0, False, "0"),
])
def test_the_report_reads_servers_stopped_after_training_as_stopped(tmp_path, name, returncode, stopped_when_done, shown):
    job = launch.Job({}, [], [], str(tmp_path), parameter_server=True)
    job.processes[name] = Ended(returncode)
    if stopped_when_done:
        job.stopped_when_done.add(name)
    assert job.outcome(name) == shown
