"""Output paths per task and trial, flag parsing, and batch scaling arithmetic."""

import pytest

from cassava.spec import DatasetSpec
from cassava.task import CassavaTask
from trainer.runtime import config as config_lib
from trainer import outputs
from trainer.process import launch
from trainer.runtime import strategy
from trainer.cluster import resolve
from trainer.tasks import DataError

pytestmark = pytest.mark.unit

SINGLE = resolve({})


def test_defaults_without_environment_are_local():
    dirs = outputs.resolve_dirs(None, None, None, {}, None)
    assert dirs == outputs.OutputDirs("output/model", "output/checkpoints", "output/logs")


def test_vertex_aip_variables_are_the_defaults():
    environ = {"AIP_MODEL_DIR": "gs://b/job/model/", "AIP_CHECKPOINT_DIR": "gs://b/job/checkpoints/",
               "AIP_TENSORBOARD_LOG_DIR": "gs://b/job/logs/"}
    dirs = outputs.resolve_dirs(None, None, None, environ, None)
    assert dirs == outputs.OutputDirs("gs://b/job/model/", "gs://b/job/checkpoints/", "gs://b/job/logs/")


def test_flags_beat_environment():
    dirs = outputs.resolve_dirs("/m", "/c", "/t", {"AIP_MODEL_DIR": "gs://x/model"}, None)
    assert dirs == outputs.OutputDirs("/m", "/c", "/t")


def test_a_model_dir_flag_moves_checkpoints_and_logs_away_from_trainer_runs_local_defaults():
    """trainer.run sets AIP_* to output/... where no platform did; a Task it runs with --model-dir
    keeps its checkpoints and logs beside that model, not in ./output/."""
    for trial in (None, "4"):
        defaults = outputs.local_defaults(trial)
        assert defaults["AIP_CHECKPOINT_DIR"] == ("output/checkpoints" if trial is None else "output/checkpoints/trial-4")
        dirs = outputs.resolve_dirs("/out/model", None, None, defaults, trial)
        suffix = "" if trial is None else "/trial-4"
        assert dirs == outputs.OutputDirs(f"/out/model{suffix}", f"/out/checkpoints{suffix}", f"/out/logs{suffix}")
    # a platform's own variables still win over the siblings
    vertex = {"AIP_MODEL_DIR": "gs://b/job/model/", "AIP_CHECKPOINT_DIR": "gs://b/job/checkpoints/",
              "AIP_TENSORBOARD_LOG_DIR": "gs://b/job/logs/"}
    assert outputs.resolve_dirs("/out/model", None, None, vertex, None) == outputs.OutputDirs(
        "/out/model", "gs://b/job/checkpoints/", "gs://b/job/logs/")


def test_siblings_of_a_gcs_model_dir():
    assert outputs.sibling("gs://bucket/run/model/", "checkpoints") == "gs://bucket/run/checkpoints"
    assert outputs.sibling("gs://bucket", "logs") == "gs://bucket/logs"
    assert outputs.sibling("model", "logs") == "logs"


def test_trial_gets_its_own_subdirectory():
    dirs = outputs.resolve_dirs("gs://b/model", None, None, {}, "3")
    assert dirs == outputs.OutputDirs("gs://b/model/trial-3", "gs://b/checkpoints/trial-3", "gs://b/logs/trial-3")


def test_parallel_trials_never_share_a_directory():
    paths = {outputs.resolve_dirs("/out/model", None, None, {}, trial).model_dir for trial in ("1", "2", "3")}
    assert len(paths) == 3


def test_vertex_tuning_path_that_already_names_the_trial_is_kept():
    environ = {"AIP_MODEL_DIR": "gs://b/hp/7/model"}
    assert outputs.resolve_dirs(None, None, None, environ, "7").model_dir == "gs://b/hp/7/model"


def test_config_trial_comes_from_cluster_spec():
    cluster = resolve({"CLUSTER_SPEC": '{"cluster": {"master": ["m:1"]}, "task": {"type": "master", "index": 0, "trial": "5"}}'})
    config = config_lib.parse(["--model-dir", "/out/model", "--weights", "none"], {}, cluster, CassavaTask())
    assert config.model_dir == "/out/model/trial-5"
    assert config.checkpoint_dir == "/out/checkpoints/trial-5"


def test_flag_defaults_follow_the_lab():
    config = config_lib.parse([], {}, SINGLE, CassavaTask())
    flags = config.task_flags
    assert (config.per_replica_batch_size, flags.image_size, flags.weights) == (64, 300, "imagenet")
    assert flags.dataset == DatasetSpec("tfds", "cassava")
    assert config.hypertune_metric == "accuracy"


@pytest.mark.parametrize("argv", [
    ["--per-replica-batch-size", "-4"],
    ["--per-replica-batch-size", "0"],
    ["--dataset", "s3:bucket"],
    ["--dataset", "synthetic:many"],
    ["--learning-rate", "0"],
    ["--strategy", "horovod"],
    ["--epochs", "1.5"],
])
def test_bad_flag_values_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        config_lib.parse(argv, {}, SINGLE, CassavaTask())
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_parameter_server_without_ps_is_a_config_error():
    cluster = resolve({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "chief", "index": 0}}'})
    with pytest.raises(config_lib.ConfigError, match="needs ps tasks"):
        config_lib.parse(["--strategy", "parameter_server"], {}, cluster, CassavaTask())


def test_missing_weights_file_is_a_data_error_before_any_data_is_read(tmp_path):
    task = CassavaTask()
    flags = config_lib.parse(["--weights", str(tmp_path / "absent.h5")], {}, SINGLE, task).task_flags
    with pytest.raises(DataError, match="no such file"):
        task.prepare(flags)


@pytest.mark.parametrize("environ, expected", [
    ({}, "mirrored"),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "chief", "index": 0}}'}, "multi_worker_mirrored"),
    ({"TF_CONFIG": '{"cluster": {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "task": {"type": "ps", "index": 0}}'}, "parameter_server"),
])
def test_auto_strategy_follows_the_cluster(environ, expected):
    assert strategy.choose("auto", resolve(environ)) == expected
    assert strategy.choose("one_device", resolve(environ)) == "one_device"


def test_launcher_plans_mwms_with_chief_counted_as_a_worker():
    cluster, tasks = launch.plan_cluster(workers=3, ps=0, evaluator=False, ports=[1, 2, 3])
    assert cluster == {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]}
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1"]


def test_launcher_plans_ps_jobs_with_a_separate_coordinator_and_evaluator():
    cluster, tasks = launch.plan_cluster(workers=2, ps=1, evaluator=True, ports=[1, 2, 3, 4])
    assert cluster == {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"], "ps": ["localhost:4"]}
    assert [t.name for t in tasks] == ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]


def test_launcher_tf_configs_resolve_to_each_task():
    cluster, tasks = launch.plan_cluster(workers=2, ps=1, evaluator=True, ports=[1, 2, 3, 4])
    resolved = [resolve({"TF_CONFIG": launch.tf_config(cluster, task)}) for task in tasks]
    assert [r.is_chief for r in resolved] == [True, False, False, False, False]
    assert {r.num_ps for r in resolved} == {1}


def test_backup_every_steps_is_auto_by_default_zero_per_epoch_or_a_count():
    from trainer.runtime import config as config_lib
    from trainer.cluster import resolve

    cluster = resolve({})
    parse = lambda *argv: config_lib.parse(list(argv), {}, cluster, CassavaTask()).backup_every_steps  # noqa: E731
    assert parse() is None  # auto
    assert parse("--backup-every-steps", "0") == 0
    assert parse("--backup-every-steps", "250") == 250
    with pytest.raises(SystemExit):
        parse("--backup-every-steps", "-5")


def test_a_wrong_flag_is_one_line_and_exit_2(capsys):
    from trainer import fit

    with pytest.raises(SystemExit) as stopped:
        fit.build_parser(CassavaTask()).parse_args(["--per-replica-batch-size", "0"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "python -m cassava.task: error: argument --per-replica-batch-size: must be positive, got 0 (--help lists the flags)"]
