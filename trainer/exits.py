"""The exit-code contract: what each code of a job's process (a Task under `trainer.fit`, any command
under `trainer.run`) means to the platform that decides whether to restart it.

| code | meaning                                                    | a restart ...        |
|------|------------------------------------------------------------|----------------------|
| 0    | done                                                       | is not needed        |
| 2    | configuration or bad input (flags, TF_CONFIG, data, paths, a missing or forbidden bucket) | cannot help: permanent |
| 143  | this task lost its cluster, was preempted (SIGTERM), or Cloud Storage failed past the client's retries | resumes from the backup |
| else | a bug                                                      | may or may not help  |

143 (128 + SIGTERM) is one of the codes Kubeflow's `restartPolicy: ExitCode` retries (130, 137,
138, 143; training-operator's IsRetryableExitCode), the codes the generated JobSet's
podFailurePolicy does not fail at once, and what a task killed by SIGTERM would report anyway.
Vertex AI treats a replica's own non-zero exit as permanent and fails the job, except the codes of
SIGABRT and SIGSEGV, which it retries ("Understanding the training service"; docs/failures-and-restarts.md);
after a preemption it restarts the job itself, and the backup is what makes that cheap.
"""

OK = 0
CONFIG = 2
RETRYABLE = 143


def of_process(returncode: int) -> int:
    """A process's exit code as a shell and a container engine report it: subprocess's -N for a
    process killed by signal N becomes 128 + N (SIGTERM: 143, SIGKILL: 137)."""
    return 128 - returncode if returncode < 0 else returncode
