# Sourced by the image scripts: the container engine and its settings, from scripts/rehearsal/engine.py, the
# one place that decides them for every script, the rehearsal and the tests (read its docstring).
# Exports ENGINE (docker|podman), BUILDER (docker|buildah), IMAGES_WORK and, for podman, CONTAINERS_CONF.
engine_exports=$(python3 "$(dirname "${BASH_SOURCE[0]}")/../rehearsal/engine.py") || { return 2 2>/dev/null || exit 2; }
eval "$engine_exports"
unset engine_exports
