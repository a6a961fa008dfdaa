"""Cloud Build's rules over the runner: a build config run on this machine as Cloud Build runs it
(`python scripts/submit_build.py local`, the flags of `gcloud builds submit`), before a build costs.

| module            | its one concern                                                                   |
|-------------------|-----------------------------------------------------------------------------------|
| config.py         | the config against Cloud Build's `Build` message and checks; the build substituted |
| substitutions.py  | built-ins, trigger-only values, `_KEY`s, `$$`, dynamic substitutions, the refusals |
| graph.py          | `waitFor`: which steps may start                                                  |
| trigger.py        | a BuildTrigger file: its config, substitutions and the commit's built-ins          |
| steps.py          | each step a container of the runner; the first failure or timeout ends the build   |
| standins.py       | what runs each step image here (standins/: docker, gcloud; CI's stand-in base)     |
| registry.py       | Artifact Registry's stand-in: docker-registry behind a CONNECT front              |
| log.py            | the build's log, each line prefixed with its step                                |
| build.py          | one build from submission to its end: workspace, services, push of `images:`       |

docs/rehearsal.md ("Rehearse a Cloud Build") has each rule and the page it comes from.
"""
