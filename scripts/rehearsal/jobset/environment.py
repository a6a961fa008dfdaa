"""Each container of a pod as the kubelet starts it: its environment with the downward API
resolved and `$(VAR)` expanded, JOB_COMPLETION_INDEX as the Job controller adds it, the API
server's service links as the kubelet adds them, HOSTNAME as the runtime sets it, and its command
and args expanded."""

from __future__ import annotations

import re

from scripts.rehearsal.runner import RehearsalError
from trainer import cluster as trainer_cluster


def resolve_pod(identity: dict, manifest: dict, name: str) -> dict:
    """The pod `identity` named `name`, with its containers as the kubelet starts them."""
    pod = {"name": name, **identity}
    pod_spec = pod_spec_of(manifest, identity["replicated_job"])
    pod["containers"] = [_pod_container(container, pod, pod_spec) for container in pod_spec["containers"]]
    pod["env"] = pod["containers"][0]["env"]
    return pod


def pod_spec_of(manifest: dict, replicated_job: str) -> dict:
    rjob = next(r for r in manifest["spec"]["replicatedJobs"] if r["name"] == replicated_job)
    return rjob["template"]["spec"]["template"]["spec"]


# The API server's Service (`kubernetes` in `default`: one port, named https, 443/TCP) at the first
# address of the cluster's service range; GKE picks its own range, this is kubeadm's. Nothing a pod
# of ours runs dials it, but trainer.run reads KUBERNETES_SERVICE_HOST to know it runs in a pod.
API_SERVER_ADDRESS, API_SERVER_PORT = "10.96.0.1", 443


def service_links() -> dict[str, str]:
    """The variables the kubelet gives every container for the API server's Service, whatever the
    pod's enableServiceLinks says (pkg/kubelet/envvars FromServices: the service's host and
    ports, then Docker's link variables)."""
    address = f"tcp://{API_SERVER_ADDRESS}:{API_SERVER_PORT}"
    prefix = f"KUBERNETES_PORT_{API_SERVER_PORT}_TCP"
    return {"KUBERNETES_SERVICE_HOST": API_SERVER_ADDRESS, "KUBERNETES_SERVICE_PORT": str(API_SERVER_PORT),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(API_SERVER_PORT), "KUBERNETES_PORT": address,
            prefix: address, f"{prefix}_PROTO": "tcp", f"{prefix}_PORT": str(API_SERVER_PORT),
            f"{prefix}_ADDR": API_SERVER_ADDRESS}


_FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")


def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion of an env value, a command or an args entry, as
    third_party/forked/golang/expansion/expand.go (kubernetes/kubernetes) reads it: `$$` is one `$`;
    `$(` up to the first `)` names a variable, replaced by its value when `variables` defines it
    and left as written when not (a name with `$(` or `$$` in it included); a `$(` never closed,
    a `$` before any other character, and a `$` at the end stay as they are."""
    out, cursor = [], 0
    while cursor < len(text):
        if text[cursor] != "$" or cursor + 1 == len(text):
            out.append(text[cursor])
            cursor += 1
            continue
        following = text[cursor + 1]
        if following == "(":
            closer = text.find(")", cursor + 2)
            if closer < 0:
                out.append("$(")
                cursor += 2
                continue
            name = text[cursor + 2:closer]
            out.append(variables.get(name, f"$({name})"))
            cursor = closer + 1
        else:
            out.append("$" if following == "$" else "$" + following)
            cursor += 2
    return "".join(out)


def _pod_container(container: dict, pod: dict, pod_spec: dict) -> dict:
    """One container of `pod` with its environment, command and args as the kubelet and the runtime
    build them."""
    where = f"{pod['hostname']} container {container['name']}"
    if container.get("envFrom"):
        raise RehearsalError(f"{where}: envFrom reads ConfigMaps or Secrets, which exist only in a cluster")
    links = service_links()
    defined: dict[str, str] = {}  # the container's own entries, in order
    for entry in container.get("env", []):
        if "valueFrom" in entry:
            defined[entry["name"]] = _field_value(entry["valueFrom"], pod, pod_spec, f"{where} env {entry['name']}")
        else:
            # $(VAR) reads the entries before it, then the service links (kubelet_pods.go's
            # MappingFuncFor(tmpEnv, serviceEnv)).
            defined[entry["name"]] = expand(entry.get("value", ""), {**links, **defined})
    # The Job controller adds JOB_COMPLETION_INDEX to every container that does not define it.
    defined.setdefault(trainer_cluster.JOB_COMPLETION_INDEX, str(pod["completion_index"]))
    # An entry of the container's own wins over a service link of its name. The command and args
    # expand against these; HOSTNAME is the runtime's, after the kubelet has expanded them.
    kubelet_env = {**defined, **{name: value for name, value in links.items() if name not in defined}}
    command, args = container.get("command"), container.get("args")
    return {"name": container["name"], "image": container.get("image"),
            "command": None if command is None else [expand(part, kubelet_env) for part in command],
            "args": None if args is None else [expand(part, kubelet_env) for part in args],
            "ports": container.get("ports", []), "env": {"HOSTNAME": pod["hostname"], **kubelet_env}}


def _field_value(source: dict, pod: dict, pod_spec: dict, where: str) -> str:
    """A downward-API value, as the kubelet resolves it for `pod` (a missing label gives "")."""
    if set(source) != {"fieldRef"}:
        raise RehearsalError(f"{where}: valueFrom.{next(iter(source))} is known only inside a cluster")
    path = source["fieldRef"]["fieldPath"]
    match = _FIELD_PATH.fullmatch(path)
    if match:
        return pod[match.group(1)].get(match.group(2), "")
    known = {"metadata.name": pod["name"], "metadata.namespace": pod["namespace"],
             "spec.serviceAccountName": pod_spec.get("serviceAccountName", "default")}
    if path not in known:
        raise RehearsalError(f"{where}: fieldRef {path} is known only once the pod runs")
    return known[path]
