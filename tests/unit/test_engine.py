"""scripts/rehearsal/engine.py: the one engine configuration every script, the rehearsal and the tests use."""

import pytest

from scripts.rehearsal import engine


def conf(**machine):
    facts = dict(hard_files=20000, hard_processes=96364, systemd=False, unified_cgroups=False, runc=True)
    return engine.containers_conf(**{**facts, **machine})


def test_limits_are_the_hard_limits_this_user_has():
    text = conf()
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]' in text  # nproc capped at 32768
    assert 'nproc=500:500' in conf(hard_processes=500)


def test_systemd_and_cgroup_settings_only_where_the_machine_needs_them():
    assert 'cgroup_manager = "cgroupfs"' in conf() and 'events_logger = "file"' in conf()
    assert "cgroup_manager" not in conf(systemd=True) and "events_logger" not in conf(systemd=True)
    assert 'runtime = "runc"' in conf()  # crun refuses a hybrid cgroup layout
    assert "runtime" not in conf(unified_cgroups=True) and "runtime" not in conf(runc=False)


def test_podman_keeps_its_default_image_store(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "docker_answers", lambda: False)
    monkeypatch.setattr(engine.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    chosen = engine.settings(environ={"IMAGES_WORK": str(tmp_path / "work")})
    # Only the runtime settings: the images are the ones `podman images` and `podman build` see.
    assert (chosen.engine, chosen.builder) == ("podman", "buildah")
    assert set(chosen.environ) == {"CONTAINERS_CONF"}
    assert (tmp_path / "work" / "containers.conf").read_text() == engine.machine_containers_conf()
    assert "export CONTAINERS_CONF=" in chosen.shell() and "export ENGINE=podman" in chosen.shell()


def test_docker_needs_nothing_more(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "docker_answers", lambda: True)
    chosen = engine.settings(environ={"IMAGES_WORK": str(tmp_path)})
    assert (chosen.engine, chosen.builder, chosen.environ) == ("docker", "docker", {})


def test_no_engine_and_unknown_engines_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "docker_answers", lambda: False)
    monkeypatch.setattr(engine.shutil, "which", lambda tool: None)
    with pytest.raises(engine.EngineError, match="install podman and buildah"):
        engine.settings(environ={"IMAGES_WORK": str(tmp_path)})
    with pytest.raises(engine.EngineError, match="no daemon answers"):
        engine.settings("docker", environ={"IMAGES_WORK": str(tmp_path)})
    with pytest.raises(engine.EngineError, match="unknown container engine"):
        engine.settings("lxc", environ={"IMAGES_WORK": str(tmp_path)})

