"""Whose state a checkpoint directory holds (trainer.runtime.ownership): which job a task belongs to, where
its state goes, when the evaluator may read it."""

import argparse
import json

import pytest

from trainer.runtime import config as config_lib
from trainer import outputs
from trainer.runtime import ownership
from trainer.cluster import resolve
from trainer.runtime.ownership import FINISHED, TRAINING, Record
from trainer.tasks import Task

pytestmark = pytest.mark.unit


class LineFit(Task):
    name = "linefit"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--rows", type=int, default=2048)


def tf_config(cluster: dict, task_type: str, index: int = 0, trial: str | None = None) -> dict:
    task = {"type": task_type, "index": index, **({"trial": trial} if trial else {})}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


MWMS = {"chief": ["h:1"], "worker": ["h:2"]}
PSS = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}
DOCS = ["--epochs", "3", "--per-replica-batch-size", "32"]


def job(argv, environ, task=None):
    cluster = resolve(environ)
    task = task or LineFit()
    config = config_lib.parse(argv, environ, cluster, task)
    return ownership.identity(config, cluster, type(task).__qualname__), config, cluster


def test_every_task_of_a_job_belongs_to_the_same_job():
    """Chief, worker and evaluator of one job, and the same job on other ports (trainer.launch picks
    new ones every time): one identity."""
    argv = [*DOCS, "--model-dir", "/tmp/linefit/pss"]
    other_ports = {role: [f"other:{9000 + i}" for i, _ in enumerate(hosts)] for role, hosts in PSS.items()}
    keys = {job(argv, tf_config(PSS, role, index))[0].key
            for role, index in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0))}
    keys.add(job(argv, tf_config(other_ports, "chief"))[0].key)
    assert len(keys) == 1


def test_a_single_replica_job_and_its_evaluator_are_one_job():
    """Vertex gives a chief-only job a CLUSTER_SPEC; its chief trains as one process, its evaluator
    still sees a cluster. They count the same training tasks."""
    spec = {"cluster": {"workerpool0": ["wp0:2222"], "workerpool3": ["wp3:2222"]}}
    chief = job(DOCS, {"CLUSTER_SPEC": json.dumps({**spec, "task": {"type": "workerpool0", "index": 0}})})[0]
    evaluator = job(DOCS, {"CLUSTER_SPEC": json.dumps({**spec, "task": {"type": "workerpool3", "index": 0}})})[0]
    assert chief.key == evaluator.key


def test_the_docs_two_commands_are_two_jobs():
    mwms = job([*DOCS, "--model-dir", "/tmp/linefit/mwms"], tf_config(MWMS, "chief"))[0]
    pss = job([*DOCS, "--model-dir", "/tmp/linefit/pss"], tf_config(PSS, "chief"))[0]
    assert mwms.key != pss.key


@pytest.mark.parametrize("changed", [["--epochs", "5"], ["--learning-rate", "0.5"], ["--rows", "10"],
                                     ["--model-dir", "/elsewhere/model"], ["--seed", "7"]])
def test_a_flag_that_changes_what_is_trained_or_where_it_is_saved_makes_another_job(changed):
    base = [*DOCS, "--model-dir", "/out/model"]
    assert job(base, tf_config(MWMS, "chief"))[0].key != job(base + changed, tf_config(MWMS, "chief"))[0].key


@pytest.mark.parametrize("changed", [["--backup-every-steps", "5"], ["--eval-timeout", "60"],
                                     ["--tensorboard-dir", "/tb"], ["--checkpoint-dir", "/ck"],
                                     ["--profile-steps", "3-4"], ["--validation-steps", "2"]])
def test_a_flag_that_only_says_how_to_run_keeps_the_job(changed):
    base = [*DOCS, "--model-dir", "/out/model"]
    assert job(base, tf_config(MWMS, "chief"))[0].key == job(base + changed, tf_config(MWMS, "chief"))[0].key


def test_two_trials_of_a_tuning_job_are_two_jobs():
    one = job(DOCS, {**tf_config(MWMS, "chief"), "CLOUD_ML_TRIAL_ID": "1"})[0]
    two = job(DOCS, {**tf_config(MWMS, "chief"), "CLOUD_ML_TRIAL_ID": "2"})[0]
    again = job(DOCS, tf_config(MWMS, "chief", trial="1"))[0]
    assert one.key != two.key and one.key == again.key


def test_a_vertex_job_id_does_not_make_a_resubmitted_spec_another_job():
    """The same spec and output directory resubmitted (its restarts used up, a timeout) resumes."""
    environ = {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["a:1"], "workerpool1": ["b:1"]},
                                           "task": {"type": "workerpool0", "index": 0}})}
    assert job(DOCS, {**environ, "CLOUD_ML_JOB_ID": "111"})[0] == job(DOCS, {**environ, "CLOUD_ML_JOB_ID": "222"})[0]


def test_an_object_flag_without_a_stable_text_counts_by_its_type():
    class Opaque:
        pass

    assert ownership._plain(Opaque()) == Opaque.__qualname__
    assert ownership._plain({"b": (1, 2), "a": None}) == {"a": None, "b": [1, 2]}


ME = job([*DOCS, "--model-dir", "/tmp/linefit/pss"], tf_config(PSS, "chief"))[0]
OTHER = job([*DOCS, "--model-dir", "/tmp/linefit/mwms"], tf_config(MWMS, "chief"))[0]


def record(who, state=TRAINING, run="r1", launch=""):
    return Record(who.key, who.as_dict, state, run, launch)


def test_a_free_directory_is_this_jobs():
    assert ownership.place("/c", ME, None, False, False) == ownership.Place("/c")


def test_this_jobs_own_record_keeps_the_directory():
    assert ownership.place("/c", ME, record(ME), True, False).path == "/c"


def test_another_jobs_state_sends_this_job_to_a_place_of_its_own_with_a_line_naming_both():
    found = ownership.place("/tmp/linefit/checkpoints", ME, record(OTHER), True, False)
    assert found.path == f"/tmp/linefit/checkpoints/jobs/{ME.key}"
    assert "\n" not in found.note
    assert "--model-dir /tmp/linefit/mwms" in found.note and "--model-dir /tmp/linefit/pss" in found.note
    assert "3 training tasks + 1 ps" in found.note and "2 training tasks" in found.note
    assert "--epochs" not in found.note  # the same in both: not a difference


def test_state_that_no_record_names_is_not_taken_for_this_jobs():
    found = ownership.place("gs://b/run/checkpoints/", ME, None, True, False)
    assert found.path == f"gs://b/run/checkpoints/jobs/{ME.key}" and "no job record names" in found.note


def test_a_place_of_its_own_is_kept_once_taken_even_if_the_directory_is_freed():
    assert ownership.place("/c", ME, None, False, True).path == f"/c/jobs/{ME.key}"


def test_many_differences_are_cut_short_in_the_line():
    many = job(["--epochs", "9", "--per-replica-batch-size", "8", "--seed", "1", "--rows", "5", "--learning-rate", "0.3",
                "--model-dir", "/x"], tf_config(MWMS, "chief"))[0]
    note = ownership.place("/c", ME, record(many), True, False).note
    assert "more" in note and "\n" not in note


def new_run():
    return "fresh"


def test_a_restart_of_the_job_keeps_its_run_and_resumes():
    start, clear = ownership.start(record(ME, run="r1", launch="CLOUD_ML_JOB_ID=1"), ME, True, "CLOUD_ML_JOB_ID=2", new_run)
    assert (start.run, start.state, start.launch, clear) == ("r1", TRAINING, "CLOUD_ML_JOB_ID=2", False)


def test_a_rerun_of_a_finished_job_trains_afresh_and_clears_the_earlier_runs_checkpoints():
    start, clear = ownership.start(record(ME, FINISHED), ME, False, "", new_run)
    assert (start.run, start.state, clear) == ("fresh", TRAINING, True)


def test_a_new_place_starts_a_new_run_with_nothing_to_clear():
    start, clear = ownership.start(None, ME, False, "", new_run)
    assert (start.key, start.run, clear) == (ME.key, "fresh", False)


def test_the_evaluator_waits_for_its_chief_to_record_the_run():
    assert not ownership.evaluator_may_start(None, ME, "T=1")
    assert not ownership.evaluator_may_start(record(OTHER), ME, "T=1")
    assert ownership.evaluator_may_start(record(ME, TRAINING), ME, "T=1")


def test_the_evaluator_does_not_take_an_earlier_launchs_finished_run_for_its_own():
    assert not ownership.evaluator_may_start(record(ME, FINISHED, launch="T=old"), ME, "T=new")
    # the chief of this launch finished before the evaluator looked
    assert ownership.evaluator_may_start(record(ME, FINISHED, launch="T=new"), ME, "T=new")
    # nothing to tell launches apart: the finished run is this job's
    assert ownership.evaluator_may_start(record(ME, FINISHED), ME, "")


def test_the_launch_token_comes_from_the_platform_first():
    assert ownership.launch_token({"CLOUD_ML_JOB_ID": "42", outputs.LAUNCH_ID: "x"}) == "CLOUD_ML_JOB_ID=42"
    assert ownership.launch_token({outputs.LAUNCH_ID: "x"}) == f"{outputs.LAUNCH_ID}=x"
    assert ownership.launch_token({}) == ""


def test_records_round_trip_and_anything_else_reads_as_none():
    original = record(ME, FINISHED, "r9", "T=1")
    assert Record.from_json(original.to_json()) == original
    for text in ("", "not json", "[]", '{"key": 1, "job": {}}', '{"job": {}}'):
        assert Record.from_json(text) is None
