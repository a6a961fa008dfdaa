"""What the container-tier tests share: the engine's environment, a command runner, a small
training run's arguments, and the environment the test images are built with."""

from __future__ import annotations

import subprocess

from helpers import FLOAT32, REPO, clean_env, run_processes

SMALL_TRAINING = ["--dataset", "synthetic:32", "--epochs", "1", "--steps-per-epoch", "2", "--image-size", "32",
                  "--architecture", "small", "--weights", "none", "--per-replica-batch-size", "4", *FLOAT32]


def sh(*command, env=None, timeout=1800, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=REPO, env=env or image_env(), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def build_image(engine, *args: str, check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Builds as scripts/supply_chain/images.sh builds (docker, or daemonless buildah), through
    scripts/rehearsal/engine.py's `build`: a build whose cache lookup raced another test's image
    removal (buildah before 1.43) is started again there."""
    from scripts.rehearsal.engine import build

    tool, env = engine
    result = build("docker" if tool == "docker" else "buildah", list(args), env, timeout=timeout, cwd=str(REPO))
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(result.args)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def image_env(**extra) -> dict:
    env = clean_env(**extra)
    env["PATH"] = f"{REPO / '.venv' / 'bin'}:{env['PATH']}"
    return env


def engine_settings() -> dict[str, str]:
    """ENGINE, IMAGES_WORK and the engine's variables, from scripts/rehearsal/engine.py as every script gets them."""
    from scripts.rehearsal import engine

    chosen = engine.settings()
    return {"ENGINE": chosen.engine, "IMAGES_WORK": chosen.images_work, **chosen.environ}


# What earlier rehearsals had left on this machine before this run's first one (note_earlier_leftovers):
# not this run's doing, so not its tests' failure.
EARLIER: set[str] = set()


# What marks a Cloud Build rehearsal's things (scripts/rehearsal/cloudbuild/: its steps, network,
# volume, scratch directory and services carry the first; its image tags the second). Its tests run
# as a work unit of their own, beside the other rehearsals' (tests/parallel.py), so each side counts
# only its own kind.
CLOUD_BUILD_MARKS = ("rehearsal-cloudbuild-", "-docker.pkg.dev/")


def of_cloud_build(entry: str) -> bool:
    return any(mark in entry for mark in CLOUD_BUILD_MARKS)


def note_earlier_leftovers(engine) -> list[str]:
    """Notes what rehearsals outside this run left (a killed run of another checkout on a shared
    machine, say), before this run makes any: leftovers() leaves them out from then on. Called once
    per worker when its engine fixture is made, which is before that worker's first rehearsal (the
    rehearsals run in one unit, tests/parallel.py's engine unit; the Cloud Build ones in a unit of
    their own, and each side counts only its own kind)."""
    found = leftovers(engine) + leftovers(engine, cloud_build=True)
    EARLIER.update(found)
    return found


def leftovers(engine, cloud_build: bool = False) -> list[str]:
    """What a rehearsal of this run left on this machine (scripts/rehearsal/session.py says what it
    looks for); every rehearsal test asserts it is empty. The test run's own servers are not
    counted: this process's children, and those of the run's other workers (the integration tier's,
    running beside this test: helpers.run_processes). A server a rehearsal left behind outlived its
    runner, and so belongs to init, not to the run. What was there before the run's first rehearsal
    (EARLIER) is not counted either. `cloud_build`: a Cloud Build rehearsal's things alone
    (CLOUD_BUILD_MARKS); otherwise everything else."""
    import os
    import subprocess

    from scripts.rehearsal.engine import Engine
    from scripts.rehearsal.session import leftovers as left_by_rehearsals

    tool, env = engine
    left = left_by_rehearsals(Engine(tool, env), parent=os.getpid())
    ours = run_processes()  # after that listing: every process it saw and the run owns is in here
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines()
    outside = {f"process {args}" for pid, args in (line.split(None, 1) for line in listing if len(line.split(None, 1)) == 2)
               if int(pid) not in ours}
    # A process the first listing named is left over if one like it still runs outside the run.
    return [entry for entry in left if (not entry.startswith("process ") or entry in outside) and entry not in EARLIER
            and of_cloud_build(entry) == cloud_build]


def user_env(**extra) -> dict:
    """A user's shell: none of the engine's settings (scripts/rehearsal/engine.py's) that the tests'
    own engine commands use; a rehearsal finds them itself."""
    return {k: v for k, v in clean_env(**extra).items() if not k.startswith("CONTAINERS_")}


def run_as_written(engine, image: str, tag: str, command: str, cwd) -> subprocess.CompletedProcess:
    """Runs a documented block as written, in a user's shell in `cwd`, with the tests' `image` under
    the `tag` the block names; whatever held that tag before gets it back."""
    tool, env = engine
    previous = sh(tool, "image", "inspect", "--format", "{{.Id}}", tag, env=env, check=False)
    sh(tool, "tag", image, tag, env=env)
    try:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=user_env(),
                              capture_output=True, text=True, timeout=900)
    finally:
        if previous.returncode == 0:
            sh(tool, "tag", previous.stdout.strip(), tag, env=env)
        else:
            sh(tool, "rmi", tag, env=env)


def build_env(base_image: str) -> dict:
    # The stand-in base lays out its interpreter as the production bases do (python3 in /usr/local).
    return image_env(BASE_IMAGE=base_image, TAG="test")
