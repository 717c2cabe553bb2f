#!/usr/bin/python3
"""Offline checks of deploy/Dockerfile (no container engine is needed or used).

Usage: check_dockerfile.py --source DIR --build DIR --ckptd BIN --ckptctl BIN

Checks that the Dockerfile parses into a build stage and a runtime stage on Debian 12; that the
build stage runs deploy/install-deps.sh and `make package` (or `make install`), the scripts CI
runs, and the runtime stage installs the .deb built there; that every COPY source exists in the
repository and is not excluded by .dockerignore; that the final stage runs as a numeric non-root
user, declares the store volume, exposes the ports its CKPTD_* settings listen on, and has a
HEALTHCHECK through `ckptctl health`; that every CKPTD_* variable it sets is one that
`ckptd --help` lists; and that the runtime libraries resolve: the .deb that CPack builds from
BUILD_DIR installs on this Debian 12 host under `apt-get install --simulate`, and every shared
library that ldd shows for ckptd and ckptctl belongs to a package in the closure of its Depends.

Prints one line per check and `deploy_dockerfile: P passed, F failed`; exits 0 when all pass.
"""

import argparse
import fnmatch
import glob
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Set

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_checks as dc  # noqa: E402


def dockerignore_patterns(source: str) -> List[str]:
    path = os.path.join(source, ".dockerignore")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def ignored(relpath: str, patterns: List[str]) -> bool:
    """Whether .dockerignore excludes relpath or one of its parent directories."""
    parts = relpath.strip("/").split("/")
    for n in range(1, len(parts) + 1):
        prefix = "/".join(parts[:n])
        if any(fnmatch.fnmatch(prefix, p.strip("/")) for p in patterns):
            return True
    return False


def providers(virtual: str) -> List[str]:
    """The real packages that provide a virtual package (`apt-cache showpkg`'s Reverse Provides)."""
    out = subprocess.run(["apt-cache", "showpkg", virtual], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, universal_newlines=True, check=False).stdout
    section = out.partition("Reverse Provides:")[2]
    return [line.split()[0] for line in section.split("\n") if line.strip()]


def dependency_closure(packages: List[str]) -> Set[str]:
    """The packages apt would install for `packages`: Depends and Pre-Depends, recursively, with
    virtual packages (such as the `libspdlog1.10-fmt9` that dpkg-shlibdeps writes) replaced by
    the packages that provide them."""
    closure: Set[str] = set()
    queue = list(packages)
    while queue:
        out = subprocess.run(
            ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
             "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + queue,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
        queue = []
        for line in out.stdout.split("\n"):
            name = line.strip()
            if not name:
                continue
            if not line[0].isspace():
                if name.startswith("<"):
                    queue.extend(p for p in providers(name.strip("<>")) if p not in closure)
                else:
                    closure.add(name.split(":")[0])
            elif ":" not in name:  # a provider listed under a virtual dependency
                if name.split(":")[0] not in closure:
                    queue.append(name.split(":")[0])
    return closure


def _path_forms(library: str) -> List[str]:
    """library as given, resolved, and with /usr added or removed: merged-/usr packages register
    either form."""
    forms = [library, os.path.realpath(library)]
    for path in list(forms):
        forms.append(path[len("/usr"):] if path.startswith("/usr/") else "/usr" + path)
    return forms


def owning_packages(libraries: List[str]) -> Dict[str, str]:
    """library -> the Debian package that installed it ("" when none), with one dpkg-query."""
    forms = {lib: _path_forms(lib) for lib in libraries}
    every = sorted({f for fs in forms.values() for f in fs})
    out = subprocess.run(["dpkg-query", "-S"] + every, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, universal_newlines=True, check=False).stdout
    owner = {}
    for line in out.split("\n"):
        packages, sep, path = line.partition(": ")
        if sep and "diversion" not in packages:
            owner[path.strip()] = packages.split(",")[0].split(":")[0].strip()
    return {lib: next((owner[f] for f in fs if f in owner), "") for lib, fs in forms.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True)
    parser.add_argument("--build", required=True)
    parser.add_argument("--ckptd", required=True)
    parser.add_argument("--ckptctl", required=True)
    args = parser.parse_args()
    report = dc.Report("deploy_dockerfile")
    source = os.path.abspath(args.source)

    dockerfile = os.path.join(source, "deploy", "Dockerfile")
    try:
        with open(dockerfile) as f:
            stages = dc.parse_dockerfile(f.read())
        report.check(True, "deploy/Dockerfile parses (%d stages)" % len(stages))
    except (OSError, dc.DockerfileError) as e:
        report.check(False, "deploy/Dockerfile parses", str(e))
        return report.finish()

    names = [s.name for s in stages]
    report.check(len(stages) >= 2 and "build" in names and stages[-1].name == "runtime",
                 "stages: build ... runtime (last)", "stages: %s" % names)
    report.check(all(s.image in ("debian:12", "debian:bookworm") or
                     s.image.startswith(("debian:12-", "debian:bookworm-")) for s in stages),
                 "every stage is FROM Debian 12", "images: %s" % [s.image for s in stages])

    # ------------------------------------------------------------------ build stage
    build = next((s for s in stages if s.name == "build"), stages[0])
    runs = " ; ".join(i.args for i in build.all("RUN"))
    report.check("deploy/install-deps.sh" in runs, "build stage runs deploy/install-deps.sh", runs)
    report.check(re.search(r"\bmake (?:[A-Z_]+=\S+ )*(?:package|install)\b", runs) is not None,
                 "build stage runs make package or make install", runs)

    # ------------------------------------------------------------------ COPY sources
    patterns = dockerignore_patterns(source)
    stage_names = set()
    for stage in stages:
        for ins in stage.all("COPY") + stage.all("ADD"):
            words = ins.args.split()
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            sources = paths[:-1]
            from_flag = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
            if from_flag is not None:
                report.check(from_flag.lower() in stage_names,
                             "line %d: COPY --from=%s names an earlier stage" %
                             (ins.line, from_flag))
                producer = next(s for s in stages if s.name == from_flag.lower()) \
                    if from_flag.lower() in stage_names else None
                made = " ".join(i.args for i in producer.all("RUN")) if producer else ""
                for src in sources:
                    report.check(src in made, "line %d: %s is written by stage %s" %
                                 (ins.line, src, from_flag), made)
                continue
            for src in sources:
                path = os.path.normpath(os.path.join(source, src))
                report.check(os.path.exists(path) and path.startswith(source),
                             "line %d: COPY source %s exists in the repository" % (ins.line, src))
                if src not in (".", "./"):
                    report.check(not ignored(os.path.relpath(path, source), patterns),
                                 "line %d: COPY source %s is not in .dockerignore" %
                                 (ins.line, src))
        if stage.name:
            stage_names.add(stage.name)
    report.check(ignored("build", patterns) and ignored(".git", patterns),
                 ".dockerignore leaves out build/ and .git", "patterns: %s" % patterns)

    # ------------------------------------------------------------------ runtime stage
    final = stages[-1]
    runtime_runs = " ; ".join(i.args for i in final.all("RUN"))
    report.check(re.search(r"apt-get install .*--no-install-recommends \S+\.deb", runtime_runs)
                 is not None, "runtime stage installs the built .deb with apt-get", runtime_runs)
    users = final.all("USER")
    user = users[-1].args.split(":")[0] if users else ""
    report.check(user.isdigit() and int(user) != 0,
                 "final stage runs as a numeric non-root user (USER %s)" % (user or "missing"))
    report.check("useradd" in runtime_runs and "--uid %s" % user in runtime_runs,
                 "the runtime user %s exists in the image" % user, runtime_runs)

    env = {}
    for ins in final.all("ENV"):
        env.update(dc.env_pairs(ins))
    ckptd_help = dc.run_help([args.ckptd, "--help"])
    report.check(ckptd_help.returncode == 0, "ckptd --help runs", ckptd_help.stdout)
    listed = dc.help_envs(ckptd_help.stdout)
    for name in sorted(k for k in env if k.startswith("CKPTD_")):
        report.check(name in listed and dc.flag_of_env(name) in dc.help_options(ckptd_help.stdout),
                     "ENV %s is the env of ckptd's %s" % (name, dc.flag_of_env(name)),
                     "ckptd --help lists: %s" % " ".join(sorted(listed)))
    exposed = set()
    for ins in final.all("EXPOSE"):
        exposed.update(p.split("/")[0] for p in ins.args.split())
    for name in ("CKPTD_LISTEN", "CKPTD_METRICS_LISTEN"):
        port = env.get(name, "").rpartition(":")[2]
        report.check(port.isdigit() and port in exposed,
                     "EXPOSE has the port of %s (%s)" % (name, env.get(name, "unset")),
                     "exposed: %s" % sorted(exposed))
    server_port = env.get("CKPT_SERVER", "").rpartition(":")[2]
    report.check(server_port == env.get("CKPTD_LISTEN", "").rpartition(":")[2],
                 "CKPT_SERVER (for the health check) is the listening port")
    volumes = " ".join(i.args for i in final.all("VOLUME"))
    data = env.get("CKPTD_DATA", "")
    report.check(bool(data) and any(data == v or data.startswith(v.rstrip("/") + "/")
                                    for v in re.findall(r"/[\w./-]+", volumes)),
                 "the store %s is in a VOLUME" % (data or "(CKPTD_DATA unset)"), volumes)

    health = final.all("HEALTHCHECK")
    argv = dc.exec_form(health[-1].args.partition("CMD")[2]) if health else None
    report.check(argv == ["ckptctl", "health"], "HEALTHCHECK runs [\"ckptctl\", \"health\"]",
                 health[-1].args if health else "no HEALTHCHECK")
    commands = dc.help_subcommands(dc.run_help([args.ckptctl, "--help"]).stdout)
    report.check("health" in commands, "ckptctl has the health command",
                 "ckptctl --help lists: %s" % " ".join(sorted(commands)))
    entry = dc.exec_form(final.all("ENTRYPOINT")[-1].args) if final.all("ENTRYPOINT") else None
    report.check(entry == ["ckptd"], "ENTRYPOINT is exec-form [\"ckptd\"] (signals reach it)")

    # ------------------------------------------------------------------ runtime libraries
    with tempfile.TemporaryDirectory(prefix="deploy-dockerfile-") as work:
        cpack = subprocess.run(
            ["cpack", "--config", os.path.join(args.build, "CPackConfig.cmake"), "-G", "DEB",
             "-B", work], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            universal_newlines=True, check=False)
        debs = glob.glob(os.path.join(work, "ckptd_*.deb"))
        if not report.check(cpack.returncode == 0 and len(debs) == 1,
                            "cpack builds the .deb the runtime stage installs", cpack.stdout):
            return report.finish()
        deb = debs[0]
        depends = subprocess.run(["dpkg-deb", "-f", deb, "Depends"], stdout=subprocess.PIPE,
                                 universal_newlines=True, check=False).stdout.strip()
        packages = [re.split(r"[\s(]", d.strip())[0] for d in depends.split(",") if d.strip()]
        report.check(bool(packages), "the .deb has Depends (%d packages)" % len(packages))
        with open("/etc/os-release") as f:
            os_release = f.read()
        report.check('VERSION_ID="12"' in os_release, "this host is Debian 12 like the image",
                     os_release)
        simulate = subprocess.run(
            ["apt-get", "install", "--simulate", "--no-install-recommends", deb],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C"), check=False)
        report.check(simulate.returncode == 0 and re.search(r"^Inst ckptd ", simulate.stdout,
                                                            re.MULTILINE) is not None,
                     "apt-get install --simulate of the .deb resolves its Depends",
                     simulate.stdout[-3000:])
        closure = dependency_closure(packages)
        for binary in (args.ckptd, args.ckptctl):
            ldd = subprocess.run(["ldd", binary], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, universal_newlines=True, check=False)
            libraries = re.findall(r"=>\s*(/\S+)", ldd.stdout)
            report.check(ldd.returncode == 0 and bool(libraries) and "not found" not in ldd.stdout,
                         "ldd %s resolves every library" % os.path.basename(binary), ldd.stdout)
            owners = owning_packages(libraries)
            missing = ["%s (%s)" % (lib, owners[lib] or "no package") for lib in libraries
                       if owners[lib] not in closure]
            report.check(not missing, "every library of %s comes with the .deb's Depends (%d)" %
                         (os.path.basename(binary), len(libraries)), "\n".join(missing))
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
