#!/usr/bin/python3
"""Offline checks of the Kubernetes manifests in deploy/k8s (no cluster is needed or used).

Usage: check_k8s.py --source DIR --ckptd BIN --ckptctl BIN

- Every YAML file parses, and every resource has apiVersion, kind and metadata.name.
- `kubectl kustomize` builds deploy/k8s/base and deploy/k8s/tls (kubectl's `apply`/`create
  --dry-run=client` ask an API server for its resource types even in client dry-run, so they
  cannot run offline; kustomize can, and rejects malformed resources and patches).
- In both builds: one StatefulSet replica with a headless Service of its own, a volume claim
  template mounted where CKPTD_DATA points, Service ports and probes that match the container's
  ports, native gRPC probes in the base (readiness on ckpt.v1.CheckpointService) and
  `ckptctl health` exec probes with TLS, the Prometheus scrape annotation on the metrics port,
  a non-root user equal to the image's USER, authentication configured for a non-loopback
  listener, every file setting inside a mounted Secret that has that key, and every CKPTD_*
  variable one that `ckptd --help` lists.
- The documented `kubectl create secret generic` command (run with --dry-run=client, which needs
  no server for a Secret) makes the Secret the manifests mount, with the same keys as the example.
- The example Jobs: an Indexed training Job whose init container runs `ckptctl fetch
  --wait-for-server` with --rank $(JOB_COMPLETION_INDEX) into an emptyDir the trainer mounts, and
  a CI Job running `ckptctl deps ... --json`; every ckptctl option they use is one that
  `ckptctl --help` or the command's --help lists, and every client variable is documented.
- The probes' gRPC health services answer SERVING from the built ckptd.

Prints one line per check and `deploy_k8s: P passed, F failed`; exits 0 when all pass.
"""

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_checks as dc  # noqa: E402

HEALTH_SERVICE = "ckpt.v1.CheckpointService"
VARIANTS = ("base", "tls")


def key(resource: dict) -> Tuple[str, str]:
    return resource.get("kind", ""), resource.get("metadata", {}).get("name", "")


def port_of(address: str) -> Optional[int]:
    tail = address.rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


def load_files(report: dc.Report, root: str) -> Dict[str, List[dict]]:
    """Every YAML file under root, parsed; checks the resources' identifying fields."""
    docs: Dict[str, List[dict]] = {}
    patches = set()
    for dirpath, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith((".yaml", ".yml")):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                try:
                    with open(path) as f:
                        docs[rel] = [d for d in yaml.safe_load_all(f) if d is not None]
                    report.check(True, "%s parses" % rel)
                except yaml.YAMLError as e:
                    report.check(False, "%s parses" % rel, str(e))
                    continue
                if name == "kustomization.yaml":
                    kustomization = docs[rel][0]
                    for patch in (kustomization.get("patchesJson6902", []) +
                                  kustomization.get("patches", [])):
                        if "path" in patch:
                            patches.add(os.path.normpath(os.path.join(dirpath, patch["path"])))
    for rel, items in docs.items():
        path = os.path.join(root, rel)
        if os.path.basename(rel) == "kustomization.yaml" or os.path.normpath(path) in patches:
            continue
        for doc in items:
            ok = isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind") and \
                doc.get("metadata", {}).get("name")
            report.check(bool(ok), "%s: %s has apiVersion, kind, metadata.name" %
                         (rel, key(doc) if isinstance(doc, dict) else doc))
    return docs


def kustomize(report: dc.Report, kubectl: str, directory: str) -> Optional[List[dict]]:
    try:
        out = subprocess.run([kubectl, "kustomize", directory], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True, check=False)
    except OSError as e:
        report.check(False, "kubectl kustomize %s" % os.path.basename(directory),
                     "cannot run %s: %s (deploy/install-deps.sh installs kubernetes-client)"
                     % (kubectl, e.strerror))
        return None
    if not report.check(out.returncode == 0, "kubectl kustomize %s" % os.path.basename(directory),
                        out.stderr):
        return None
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def mounted_secret_keys(pod: dict, container: dict) -> Dict[str, Tuple[str, List[str]]]:
    """mountPath -> (secret name, keys it should hold) for every Secret volume the container
    mounts (keys from `items` when given, else any key of the Secret)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if "secret" in volume:
            items = [i["key"] for i in volume["secret"].get("items", [])]
            out[mount["mountPath"].rstrip("/")] = (volume["secret"]["secretName"], items)
    return out


def check_secret_file(report: dc.Report, what: str, path: str, pod: dict, container: dict,
                      secrets: Dict[str, dict]) -> None:
    """`path` must be a key of a Secret the container mounts, and that Secret must have it."""
    directory, _, filename = path.rpartition("/")
    mounts = mounted_secret_keys(pod, container)
    if not report.check(directory in mounts, "%s %s is in a mounted Secret" % (what, path),
                        "secret mounts: %s" % sorted(mounts)):
        return
    name, items = mounts[directory]
    secret = secrets.get(name)
    keys = set((secret or {}).get("stringData", {})) | set((secret or {}).get("data", {}) or {})
    report.check(secret is not None and filename in keys and (not items or filename in items),
                 "%s: Secret %s has the key %s" % (what, name, filename),
                 "keys of the example: %s" % sorted(keys))


def check_server(report: dc.Report, variant: str, resources: List[dict],
                 secrets: Dict[str, dict], ckptd_help: str, image_user: str,
                 ckptctl_commands: set) -> None:
    by_key = {key(r): r for r in resources}
    tag = "[%s] " % variant
    sts = [r for r in resources if r.get("kind") == "StatefulSet"]
    if not report.check(len(sts) == 1, tag + "one StatefulSet"):
        return
    sts = sts[0]
    spec = sts["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    annotations = spec["template"]["metadata"].get("annotations", {})
    report.check(spec.get("replicas") == 1, tag + "replicas: 1 (the store has one writer)")
    selector = spec["selector"]["matchLabels"]
    report.check(selector.items() <= labels.items(), tag + "selector matches the pod labels")
    service = by_key.get(("Service", spec.get("serviceName")))
    report.check(service is not None and service["spec"].get("clusterIP") == "None",
                 tag + "serviceName %s is a headless Service" % spec.get("serviceName"))
    containers = [c for c in pod["containers"] if c["name"] == "ckptd"]
    if not report.check(len(containers) == 1, tag + "a container named ckptd"):
        return
    c = containers[0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    report.check("grpc" in ports and "metrics" in ports, tag + "container ports grpc and metrics",
                 str(ports))

    # Flags: ConfigMap (envFrom) and container env.
    env: Dict[str, str] = {}
    for source in c.get("envFrom", []):
        name = source.get("configMapRef", {}).get("name")
        cm = by_key.get(("ConfigMap", name))
        if report.check(cm is not None, tag + "envFrom ConfigMap %s is in the build" % name):
            env.update({k: str(v) for k, v in cm.get("data", {}).items()})
    env.update({e["name"]: str(e.get("value", "")) for e in c.get("env", [])})
    listed = dc.help_envs(ckptd_help)
    options = dc.help_options(ckptd_help)
    for name in sorted(k for k in env if k.startswith("CKPTD_")):
        report.check(name in listed and dc.flag_of_env(name) in options,
                     tag + "%s is the env of ckptd's %s" % (name, dc.flag_of_env(name)),
                     "ckptd --help lists: %s" % " ".join(sorted(listed)))
    listen = env.get("CKPTD_LISTEN", "")
    report.check(port_of(listen) == ports.get("grpc"),
                 tag + "CKPTD_LISTEN %s is on the grpc container port" % listen)
    report.check(not listen.startswith(("127.", "localhost", "[::1]")),
                 tag + "CKPTD_LISTEN is reachable from other pods")
    report.check(("CKPTD_AUTH_TOKENS" in env or "CKPTD_TLS_CLIENT_CA" in env)
                 and "CKPTD_INSECURE" not in env,
                 tag + "a non-loopback listener with authentication, without --insecure")
    metrics = env.get("CKPTD_METRICS_LISTEN", "")
    report.check(port_of(metrics) == ports.get("metrics"),
                 tag + "CKPTD_METRICS_LISTEN %s is on the metrics container port" % metrics)
    for name in ("CKPTD_AUTH_TOKENS", "CKPTD_TLS_CERT", "CKPTD_TLS_KEY", "CKPTD_TLS_CLIENT_CA",
                 "CKPT_TLS_CA", "CKPT_TLS_CERT", "CKPT_TLS_KEY", "CKPT_TOKEN_FILE"):
        if name in env:
            check_secret_file(report, tag + name, env[name], pod, c, secrets)
    if variant == "tls":
        report.check("CKPTD_TLS_CERT" in env and "CKPTD_TLS_KEY" in env,
                     tag + "TLS certificate and key set")

    # The store: the claim template, mounted above CKPTD_DATA.
    claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    data = env.get("CKPTD_DATA", "")
    report.check(any(n in mounts and (data == mounts[n] or data.startswith(mounts[n] + "/"))
                     for n in claims),
                 tag + "CKPTD_DATA %s is on the volume claim template %s" % (data, claims),
                 "mounts: %s" % mounts)

    # Probes.
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        probe = c.get(kind)
        if not report.check(probe is not None, tag + "%s present" % kind):
            continue
        if "grpc" in probe:
            report.check(probe["grpc"].get("port") == ports.get("grpc"),
                         tag + "%s gRPC port %s is the grpc container port" %
                         (kind, probe["grpc"].get("port")))
        elif "exec" in probe:
            report.check(probe["exec"].get("command") == ["ckptctl", "health"]
                         and "health" in ckptctl_commands,
                         tag + "%s runs ckptctl health, a command ckptctl has" % kind,
                         "%s; ckptctl --help lists: %s" %
                         (probe["exec"], " ".join(sorted(ckptctl_commands))))
            report.check(port_of(env.get("CKPT_SERVER", "")) == ports.get("grpc"),
                         tag + "%s: CKPT_SERVER is the grpc port" % kind)
        else:
            report.check(False, tag + "%s is a gRPC or ckptctl health probe" % kind, str(probe))
    if variant == "base":
        for kind in ("livenessProbe", "readinessProbe"):
            report.check("grpc" in c.get(kind, {}), tag + "%s is a native gRPC probe" % kind)
        report.check(c.get("readinessProbe", {}).get("grpc", {}).get("service") == HEALTH_SERVICE,
                     tag + "readiness asks for %s" % HEALTH_SERVICE)
    else:
        report.check("CKPT_TLS_CA" in env, tag + "exec probes trust the server's CA")

    # Service ports map onto the container's.
    if service is not None:
        sports = {p["name"]: p for p in service["spec"].get("ports", [])}
        report.check(set(sports) >= {"grpc", "metrics"}, tag + "Service ports grpc and metrics")
        for name, p in sports.items():
            target = p.get("targetPort", p["port"])
            number = ports.get(target) if isinstance(target, str) else target
            report.check(number is not None and number in ports.values() and p["port"] == number,
                         tag + "Service port %s (%s -> %s) is a container port" %
                         (name, p["port"], target))
        report.check(service["spec"].get("selector", {}).items() <= labels.items(),
                     tag + "Service selects the ckptd pod")

    report.check(annotations.get("prometheus.io/scrape") == "true"
                 and annotations.get("prometheus.io/port") == str(ports.get("metrics"))
                 and annotations.get("prometheus.io/path") == "/metrics",
                 tag + "Prometheus scrape annotation on the metrics port", str(annotations))
    sc = pod.get("securityContext", {})
    report.check(sc.get("runAsNonRoot") is True and str(sc.get("runAsUser")) == image_user,
                 tag + "runs as non-root %s, the image's USER" % sc.get("runAsUser"))
    report.check(c.get("securityContext", {}).get("allowPrivilegeEscalation") is False,
                 tag + "no privilege escalation")
    report.check(pod.get("terminationGracePeriodSeconds", 30) >= 45,
                 tag + "grace period covers the 30 s drain")


def ckptctl_invocations(job: dict) -> List[Tuple[dict, List[str]]]:
    pod = job["spec"]["template"]["spec"]
    out = []
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        argv = list(c.get("command", [])) + [str(a) for a in c.get("args", [])]
        if argv and argv[0] == "ckptctl":
            out.append((c, argv[1:]))
    return out


def check_jobs(report: dc.Report, docs: Dict[str, List[dict]], secrets: Dict[str, dict],
               service: dict, ckptctl: str, ckptctl_doc: str) -> None:
    jobs = [d for rel, items in docs.items() if rel.startswith("examples/") for d in items
            if d.get("kind") == "Job"]
    help_all = dc.run_help([ckptctl, "--help-all"]).stdout
    top_help = dc.run_help([ckptctl, "--help"]).stdout
    top = dc.help_options(top_help)
    subcommands = dc.help_subcommands(top_help)
    grpc_port = next((p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc"), None)
    commands = set()
    for job in jobs:
        name = job["metadata"]["name"]
        pod = job["spec"]["template"]["spec"]
        report.check(pod.get("restartPolicy") in ("Never", "OnFailure"),
                     "%s: restartPolicy Never or OnFailure" % name)
        report.check(pod.get("securityContext", {}).get("runAsNonRoot") is True,
                     "%s: runs as non-root" % name)
        for c, args in ckptctl_invocations(job):
            where = "%s/%s" % (name, c["name"])
            sub = args[0] if args else ""
            commands.add(sub)
            sub_help = dc.run_help([ckptctl, sub, "--help"])
            report.check(sub in subcommands and sub_help.returncode == 0,
                         "%s: ckptctl %s exists" % (where, sub), sub_help.stdout)
            known = top | dc.help_options(sub_help.stdout)
            for option in (a.split("=")[0] for a in args if a.startswith("--")):
                report.check(option in known, "%s: ckptctl %s lists %s" % (where, sub, option),
                             "known: %s" % " ".join(sorted(known)))
            report.check("--wait-for-server" in args, "%s: waits for the server" % where)
            env = {e["name"]: str(e.get("value", "")) for e in c.get("env", [])}
            indexed = job["spec"].get("completionMode") == "Indexed"
            for ref in re.findall(r"\$\((\w+)\)", " ".join(args)):
                report.check(ref in env or (ref == "JOB_COMPLETION_INDEX" and indexed),
                             "%s: $(%s) is defined" % (where, ref))
            for var in sorted(v for v in env if v.startswith("CKPT_")):
                report.check(var in help_all or var in ckptctl_doc,
                             "%s: client variable %s is one ckptctl documents" % (where, var))
            server = env.get("CKPT_SERVER", "")
            report.check(server.partition(":")[0].split(".")[0] == service["metadata"]["name"]
                         and port_of(server) == grpc_port,
                         "%s: CKPT_SERVER %s is the ckptd Service's grpc port" % (where, server))
            if "CKPT_TOKEN_FILE" in env:
                check_secret_file(report, where + " CKPT_TOKEN_FILE", env["CKPT_TOKEN_FILE"],
                                  pod, c, secrets)
        # The training job: rank from the completion index, output into a shared emptyDir.
        if job["spec"].get("completionMode") == "Indexed":
            spec = job["spec"]
            report.check(spec.get("completions") == spec.get("parallelism"),
                         "%s: every rank runs at once (completions == parallelism)" % name)
            init = [(c, a) for c, a in ckptctl_invocations(job)
                    if c in pod.get("initContainers", []) and a[:1] == ["fetch"]]
            if not report.check(len(init) == 1, "%s: an init container runs ckptctl fetch" % name):
                continue
            c, args = init[0]
            value = lambda opt: args[args.index(opt) + 1] if opt in args[:-1] else ""  # noqa
            report.check(value("--rank") == "$(JOB_COMPLETION_INDEX)",
                         "%s: --rank is $(JOB_COMPLETION_INDEX)" % name)
            out = value("--out")
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            init_mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            shared = [n for n, path in init_mounts.items()
                      if out.startswith(path.rstrip("/") + "/")
                      and "emptyDir" in volumes.get(n, {})]
            report.check(len(shared) == 1, "%s: --out %s is on an emptyDir" % (name, out))
            readers = [t for t in pod["containers"]
                       if any(m["name"] in shared and m["mountPath"] == init_mounts[shared[0]]
                              for m in t.get("volumeMounts", []))] if shared else []
            report.check(bool(readers), "%s: the trainer mounts that emptyDir at the same path"
                         % name)
    report.check("fetch" in commands, "an example Job fetches a rank")
    deps = [a for j in jobs for _, a in ckptctl_invocations(j) if a[:1] == ["deps"]]
    report.check(any("--json" in a for a in deps), "an example CI Job runs ckptctl deps --json")


def check_documented_secret(report: dc.Report, kubectl: str, example_path: str,
                            secrets: Dict[str, dict]) -> None:
    """Runs the `kubectl create secret generic ckptd-secrets ...` command of the example's header
    with --dry-run=client on stand-in files; the Secret must match the example's keys."""
    with open(example_path) as f:
        header = [line[1:].strip() for line in f if line.startswith("#")]
    command = ""
    for line in header:
        if command or line.startswith("kubectl create secret generic ckptd-secrets "):
            command += line.rstrip("\\").strip() + " "
            if not line.endswith("\\"):
                break
    if not report.check(bool(command), "secret.example.yaml documents kubectl create secret"):
        return
    argv = shlex.split(command)
    argv[0] = kubectl
    with tempfile.TemporaryDirectory(prefix="deploy-k8s-secret-") as work:
        for arg in argv:
            if arg.startswith("--from-file="):
                path = arg.split("=", 2)[-1]
                with open(os.path.join(work, path), "w") as f:
                    f.write("stand-in for %s\n" % path)
        try:
            out = subprocess.run(argv + ["--dry-run=client", "-o", "yaml"], cwd=work,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, check=False)
        except OSError as e:
            report.check(False, "the documented kubectl create secret runs", e.strerror)
            return
    if not report.check(out.returncode == 0, "the documented kubectl create secret runs "
                        "(--dry-run=client)", out.stderr):
        return
    made = yaml.safe_load(out.stdout)
    example = secrets.get("ckptd-secrets", {})
    report.check(set(made.get("data", {})) == set(example.get("stringData", {})),
                 "it makes the keys of the example Secret",
                 "made %s, example %s" % (sorted(made.get("data", {})),
                                          sorted(example.get("stringData", {}))))


def health_status(port: int, service: str) -> str:
    """grpc.health.v1.Health/Check on 127.0.0.1:port: SERVING, NOT_SERVING, ... or an error."""
    import grpc
    encoded = service.encode()
    request = (b"\x0a" + bytes([len(encoded)]) + encoded) if encoded else b""
    with grpc.insecure_channel("127.0.0.1:%d" % port) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda x: x,
                                    response_deserializer=lambda x: x)
        try:
            reply = check(request, timeout=10)
        except grpc.RpcError as e:
            return "%s: %s" % (e.code().name, e.details())
    status = reply[1] if len(reply) >= 2 and reply[0] == 0x08 else 0
    return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, "?")


def check_probe_services(report: dc.Report, ckptd: str, services: List[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="deploy-k8s-health-") as work:
        port_file = os.path.join(work, "port")
        log = open(os.path.join(work, "log"), "wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
        server = subprocess.Popen([ckptd, "--listen", "127.0.0.1:0", "--port-file", port_file,
                                   "--data", os.path.join(work, "data")],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(port_file) and time.monotonic() < deadline \
                    and server.poll() is None:
                time.sleep(0.05)
            if not report.check(os.path.exists(port_file), "ckptd starts for the probe check"):
                return
            port = int(open(port_file).read())
            for service in services:
                status = health_status(port, service)
                report.check(status == "SERVING", "health of %r is SERVING (got %s)" %
                             (service, status))
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--ckptd", required=True)
    parser.add_argument("--ckptctl", required=True)
    parser.add_argument("--kubectl", default="kubectl",
                        help="kubectl to run kustomize and create --dry-run=client with")
    args = parser.parse_args()
    report = dc.Report("deploy_k8s")
    root = os.path.join(os.path.abspath(args.source), "deploy", "k8s")

    docs = load_files(report, root)
    secrets = {d["metadata"]["name"]: d for d in docs.get("secret.example.yaml", [])
               if d.get("kind") == "Secret"}
    report.check({"ckptd-secrets", "ckptd-client-token"} <= set(secrets),
                 "secret.example.yaml has ckptd-secrets and ckptd-client-token")
    check_documented_secret(report, args.kubectl, os.path.join(root, "secret.example.yaml"),
                            secrets)

    with open(os.path.join(args.source, "deploy", "Dockerfile")) as f:
        stages = dc.parse_dockerfile(f.read())
    users = stages[-1].all("USER")
    image_user = users[-1].args.split(":")[0] if users else ""
    ckptd_help = dc.run_help([args.ckptd, "--help"]).stdout
    builds = {}
    for variant in VARIANTS:
        resources = kustomize(report, args.kubectl, os.path.join(root, variant))
        if resources is None:
            continue
        builds[variant] = resources
        report.check({key(r) for r in resources} ==
                     {("ConfigMap", "ckptd-config"), ("Service", "ckptd"),
                      ("StatefulSet", "ckptd")},
                     "[%s] builds the ConfigMap, Service and StatefulSet" % variant,
                     str(sorted(key(r) for r in resources)))
        check_server(report, variant, resources, secrets, ckptd_help, image_user,
                     dc.help_subcommands(dc.run_help([args.ckptctl, "--help"]).stdout))

    if "base" in builds:
        service = next(r for r in builds["base"] if r.get("kind") == "Service")
        with open(os.path.join(args.source, "docs", "ckptctl.md")) as f:
            ckptctl_doc = f.read()
        check_jobs(report, docs, secrets, service, args.ckptctl, ckptctl_doc)
        sts = next(r for r in builds["base"] if r.get("kind") == "StatefulSet")
        c = sts["spec"]["template"]["spec"]["containers"][0]
        services = sorted({c[k]["grpc"].get("service", "") for k in
                           ("startupProbe", "livenessProbe", "readinessProbe")
                           if "grpc" in c.get(k, {})})
        check_probe_services(report, args.ckptd, services)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
