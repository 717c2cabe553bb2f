#!/usr/bin/python3
"""Runs every command example of one Markdown document against a temporary real ckptd.

Usage: run_doc_examples.py --ckptd PATH --ckptctl PATH [--name NAME] [--timeout S]
                           [--python PATH] [--pythonpath DIR]... DOCUMENT

The format of the examples:

  * Inside a `console` block, a line starting with `$ ` is a command; a command line ending with
    ` \\` continues on the next line. The lines after it, up to the next `$ ` line or the end of
    the block, are its expected output (stdout and stderr merged).
  * Every command runs with `bash -c`, in order, in one fresh temporary working directory, with
    CKPT_SERVER naming a ckptd started for this document on 127.0.0.1:0 with a fresh store and
    that working directory as its --export-root (so transform jobs' relative paths land in it),
    and PATH starting with the directories of the given ckptctl and ckptd.
  * A command whose expected output has a line `ckptctl: <GRPC_CODE>...` or `ckptctl: error...`
    must exit non-zero; every other command must exit 0.
  * Output lines are compared after stripping trailing whitespace and trailing empty lines and
    after normalising addresses, durations, rates, timestamps and the working directory (written
    `$PWD` in the document). A line that is exactly `...` matches zero or more lines; `...` inside
    a line matches any text within that line.
  * A `python` block whose info string has the word `run` (```` ```python run ````) is a Python
    script: it runs in document order with the commands, as `PYTHON FILE` (--python, default this
    interpreter) in the same directory and environment, PYTHONPATH starting with the --pythonpath
    directories. It must exit 0. Its expected output is the ```` ```text ```` block that follows
    it with only blank lines between, compared as a command's; without one it must print nothing.
    Other `python` blocks (signatures, fragments needing MindSpore) are not run.
  * A `$ ckptctl` line outside a `console` block is an error, as is a document without commands.

Prints one line per command, a diff for each failure, and a closing summary line
`NAME: P passed, F failed`. Exits 0 when every command passed, 1 otherwise, 2 on usage errors.
The temporary directory is removed and ckptd stopped (SIGTERM, then SIGKILL) in every case.

Only the Python standard library is used.
"""

import argparse
import dataclasses
import difflib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

# gRPC status codes other than OK, as ckptctl prints them (absl::StatusCodeToString).
GRPC_ERROR_CODES = (
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)
# An expected-output line that marks its command as one that must exit non-zero.
_FAILURE_LINE = re.compile(r"^ckptctl: (?:%s|error)(?::|\s|$)" % "|".join(GRPC_ERROR_CODES))

# The word of a ```python info string that makes the block a runnable script.
RUN_WORD = "run"

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ESCAPED_COMMAND = re.compile(r"^\s*\$ ckptctl(?:\s|$)")

ELLIPSIS = "..."
PWD_TOKEN = "$PWD"

# Values that legitimately differ between runs, replaced on both sides before comparing. Order
# matters: timestamps before durations (a time of day is not a duration), rates before durations.
_TIMESTAMP = re.compile(
    r"(?<![\w.])\d{4}-\d{2}-\d{2}"
    r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w])")
_ADDRESS = re.compile(r"(?<![\w.])(127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1?\]):\d+(?!\d)")
_RATE = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?\s?(?:B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)/s(?!\w)")
_DURATION_UNIT = r"(?:ns|us|µs|ms|s|min|m|h)"
_DURATION = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?"
    r"(?:%s(?:\d+(?:\.\d+)?%s)*|\s(?:ns|us|µs|ms|s|min|h))(?![\w/])"
    % (_DURATION_UNIT, _DURATION_UNIT))


@dataclasses.dataclass
class DocumentError:
    """A problem of the document itself (no runnable command, escaped `$ ckptctl`, ...)."""
    line: Optional[int]       # 1-based line in the document, None for the whole document
    message: str

    def format(self, doc_label: str) -> str:
        if self.line is None:
            return "%s: %s" % (doc_label, self.message)
        return "%s:%d: %s" % (doc_label, self.line, self.message)


@dataclasses.dataclass
class Example:
    """One command of a `console` block, or one runnable `python` block, and the output the
    document shows for it."""
    line: int                 # 1-based line of the command's first line (of a script: its fence)
    command: str              # what `bash -c` runs (continuation lines joined with newlines), or
                              # a script's source
    expected: List[str]       # expected output lines as written (fence indentation removed)
    script: bool = False      # a Python script rather than a shell command
    expected_at: Optional[int] = None  # a script's: 1-based line of its output's first line

    def expects_failure(self) -> bool:
        """Scripts always must exit 0; a command when its output shows a ckptctl error."""
        return not self.script and expects_failure(self.expected)

    def first_line(self) -> str:
        if self.script:
            return "python (%d lines)" % len(self.command.rstrip("\n").split("\n"))
        return self.command.split("\n", 1)[0]

    def expected_line(self) -> int:
        """1-based document line of the first expected output line."""
        if self.script:
            return self.expected_at if self.expected_at is not None else self.line
        return self.line + self.command.count("\n") + 1


def expects_failure(expected: Sequence[str]) -> bool:
    """True when the expected output shows a ckptctl error line, so the command must fail."""
    return any(_FAILURE_LINE.match(line) for line in expected)


def _dedent(line: str, indent: str) -> str:
    """Removes up to len(indent) leading whitespace characters (content of an indented fence)."""
    n = 0
    while n < len(indent) and n < len(line) and line[n] in " \t":
        n += 1
    return line[n:]


def parse_document(text: str) -> Tuple[List[Example], List[DocumentError]]:
    """Returns the runnable examples of a Markdown text and the document errors found.

    Errors: a `$ ckptctl` line outside a `console` block, a fence never closed, output before the
    first command of a console block, a continued command running past the end of its block, and
    a document without any runnable command (so that a changed info string cannot silently
    disable every example).
    """
    examples: List[Example] = []
    errors: List[DocumentError] = []
    lines = text.split("\n")
    # The runnable script whose output block may come next (only blank lines since it closed).
    pending_script: Optional[Example] = None
    i = 0
    while i < len(lines):
        line = lines[i]
        opening = _FENCE_OPEN.match(line)
        if opening and not (opening.group("fence")[0] == "`" and "`" in opening.group("info")):
            indent, fence = opening.group("indent"), opening.group("fence")
            info = opening.group("info").strip()
            language = info.split()[0] if info else ""
            start = i
            body: List[Tuple[int, str]] = []
            i += 1
            closed = False
            while i < len(lines):
                stripped = lines[i].strip()
                if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                    closed = True
                    break
                body.append((i + 1, _dedent(lines[i], indent)))
                i += 1
            if not closed:
                errors.append(DocumentError(start + 1, "fenced block is never closed"))
            words = info.split()
            if language == "console":
                examples.extend(_parse_console_block(body, errors))
                pending_script = None
            elif language == "python" and RUN_WORD in words[1:]:
                pending_script = Example(line=start + 1,
                                         command="\n".join(content for _, content in body) + "\n",
                                         expected=[], script=True)
                examples.append(pending_script)
                i += 1
                continue
            elif language == "text" and pending_script is not None:
                pending_script.expected = [content for _, content in body]
                pending_script.expected_at = start + 2
                pending_script = None
            else:
                kind = "```" + language if language else "plain ```"
                for number, content in body:
                    if _ESCAPED_COMMAND.match(content):
                        errors.append(DocumentError(
                            number, "`$ ckptctl` line in a %s block, which is not run (only "
                            "```console blocks run)" % kind))
                pending_script = None
            i += 1
            continue
        if line.strip():
            pending_script = None
        if _ESCAPED_COMMAND.match(line):
            errors.append(DocumentError(
                i + 1, "`$ ckptctl` line outside a ```console block, which is not run"))
        i += 1
    if not examples:
        errors.append(DocumentError(
            None, "no runnable command: no `$ ` line in any ```console block and no ```python "
            "run block"))
    return examples, errors


def _parse_console_block(body: List[Tuple[int, str]],
                         errors: List[DocumentError]) -> List[Example]:
    examples: List[Example] = []
    k = 0
    while k < len(body):
        number, content = body[k]
        if not content.startswith("$ "):
            if examples:
                examples[-1].expected.append(content)
            elif content.strip():
                errors.append(DocumentError(
                    number, "output line before the first `$ ` command of a console block"))
            k += 1
            continue
        command_lines = [content[2:]]
        while command_lines[-1].endswith(" \\"):
            k += 1
            if k >= len(body):
                errors.append(DocumentError(
                    number, "command continues (` \\`) past the end of its block"))
                break
            command_lines.append(body[k][1])
        examples.append(Example(line=number, command="\n".join(command_lines), expected=[]))
        k += 1
    return examples


# ------------------------------------------------------------------------------------ matching

def normalise(line: str, workdirs: Sequence[str] = ()) -> str:
    """Replaces run-dependent values by fixed tokens and strips trailing whitespace.

    workdirs: paths of the working directory (as given and resolved), replaced by `$PWD`.
    """
    for path in sorted(workdirs, key=len, reverse=True):  # "/private/tmp/x" before "/tmp/x"
        if path:
            line = line.replace(path, PWD_TOKEN)
    line = line.replace("${PWD}", PWD_TOKEN)
    line = _TIMESTAMP.sub("<timestamp>", line)
    line = _ADDRESS.sub(lambda m: m.group(1) + ":<port>", line)
    line = _RATE.sub("<rate>", line)
    line = _DURATION.sub("<duration>", line)
    return line.rstrip()


def _trim(lines: Sequence[str]) -> List[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def _line_pattern(expected: str) -> "re.Pattern[str]":
    parts = expected.split(ELLIPSIS)
    tail = ""
    if len(parts) > 1 and parts[-1] == "" and parts[-2][-1:].isspace():
        # "ranks: ..." also matches "ranks:": the actual line lost its trailing space.
        parts[-2] = parts[-2].rstrip()
        tail = r"(?:\s.*)?"
        parts.pop()
        if len(parts) == 1:
            return re.compile(re.escape(parts[0]) + tail, re.DOTALL)
    return re.compile(".*".join(re.escape(part) for part in parts) + tail, re.DOTALL)


def line_matches(expected: str, actual: str) -> bool:
    """Both lines already normalised; `expected` may contain `...` wildcards."""
    if ELLIPSIS not in expected:
        return expected == actual
    return _line_pattern(expected).fullmatch(actual) is not None


def output_matches(expected: Sequence[str], actual: Sequence[str],
                   workdirs: Sequence[str] = ()) -> bool:
    """Whether actual output lines match the expected ones (see the module's docstring)."""
    exp = [normalise(line, workdirs) for line in _trim(expected)]
    act = [normalise(line, workdirs) for line in _trim(actual)]
    # match[i][j]: exp[i:] matches act[j:].
    match = [[False] * (len(act) + 1) for _ in range(len(exp) + 1)]
    match[len(exp)][len(act)] = True
    for i in range(len(exp) - 1, -1, -1):
        for j in range(len(act), -1, -1):
            if exp[i] == ELLIPSIS:
                match[i][j] = match[i + 1][j] or (j < len(act) and match[i][j + 1])
            else:
                match[i][j] = j < len(act) and line_matches(exp[i], act[j]) and match[i + 1][j + 1]
    return match[0][0]


def output_diff(expected: Sequence[str], actual: Sequence[str], workdirs: Sequence[str] = (),
                expected_name: str = "expected", actual_name: str = "actual") -> str:
    """A unified diff of expected vs actual output for a failure report.

    An actual line that matches the next expected line not yet used (after normalisation and
    wildcards) is shown as that expected line, so that the diff shows real differences only;
    other actual lines are shown as printed, with the working directory written `$PWD`.
    """
    exp = _trim(expected)
    act = _trim(actual)
    exp_norm = [normalise(line, workdirs) for line in exp]
    shown = []
    next_expected = 0
    for line in act:
        norm = normalise(line, workdirs)
        for i in range(next_expected, len(exp)):
            if exp_norm[i] != ELLIPSIS and line_matches(exp_norm[i], norm):
                shown.append(exp[i])
                next_expected = i + 1
                break
        else:
            for path in sorted(workdirs, key=len, reverse=True):
                line = line.replace(path, PWD_TOKEN) if path else line
            shown.append(line)
    diff = difflib.unified_diff(exp, shown, expected_name, actual_name, lineterm="", n=3)
    return "\n".join(diff)


# ------------------------------------------------------------------------------------- running

@dataclasses.dataclass
class CommandResult:
    status: Optional[int]     # exit status; None when the command timed out
    output: List[str]         # stdout and stderr merged, split into lines


def run_command(command: str, cwd: str, env: dict, timeout: float) -> CommandResult:
    """Runs `bash -c command` with stdout and stderr merged into one pipe.

    stdout is line-buffered (coreutils' stdbuf, when present) so that stdout and stderr lines
    interleave as on a terminal. The command runs in its own process group, killed on timeout.
    """
    argv = ["bash", "-c", command]
    if shutil.which("stdbuf", path=env.get("PATH")):
        argv = ["stdbuf", "-oL"] + argv
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    status: Optional[int] = None
    try:
        try:
            data, _ = process.communicate(timeout=timeout)
            status = process.returncode
        except subprocess.TimeoutExpired:
            _kill_group(process.pid)
            data, _ = process.communicate()
    finally:
        if process.poll() is None:
            _kill_group(process.pid)
            process.wait()
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return CommandResult(status=status, output=lines)


def run_script(source: str, path: str, python: str, cwd: str, env: dict,
               timeout: float) -> CommandResult:
    """Writes a runnable Python block to `path` (so that a traceback names it) and runs it with
    `python`, output as run_command's."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return run_command("exec %s -u %s" % (shlex.quote(python), shlex.quote(path)), cwd, env,
                       timeout)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _set_parent_death_signal() -> None:
    """In the child before exec: SIGTERM when the runner dies, so that ckptd never outlives it."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Server:
    """A ckptd child on 127.0.0.1:0 with its store in `data_dir`; its output goes to `log_path`."""

    def __init__(self, ckptd: str, workdir: str, data_dir: str, port_file: str, log_path: str,
                 env: dict):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        try:
            self.process = subprocess.Popen(
                [ckptd, "--listen", "127.0.0.1:0", "--port-file", port_file, "--data", data_dir,
                 "--export-root", workdir],
                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                stderr=subprocess.STDOUT, preexec_fn=_set_parent_death_signal)
        except BaseException:
            self._log.close()
            raise
        self.port_file = port_file
        self.port: Optional[int] = None

    def wait_listening(self, timeout: float) -> None:
        """Waits for the port file, then for a TCP connection to succeed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("ckptd exited with status %d before listening"
                                   % self.process.returncode)
            if self.port is None and os.path.exists(self.port_file):
                with open(self.port_file) as f:
                    content = f.read().strip()
                if content.isdigit():
                    self.port = int(content)
            if self.port is not None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("ckptd did not listen within %.0f s" % timeout)

    def stop(self, timeout: float) -> Optional[str]:
        """SIGTERM, then SIGKILL after `timeout`. Returns a problem to report, or None."""
        problem = None
        if self.process.poll() is not None:
            problem = "ckptd exited on its own with status %d while the examples ran" % (
                self.process.returncode)
        else:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
                if self.process.returncode != 0:
                    problem = "ckptd exited with status %d after SIGTERM" % self.process.returncode
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                problem = "ckptd did not stop within %.0f s of SIGTERM; killed" % timeout
        self._log.close()
        return problem

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.rstrip("\n").split("\n")[-lines:])


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line else line for line in text.split("\n"))


def _environment(ckptd: str, ckptctl: str, pythonpath: Sequence[str] = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTD_")}
    if pythonpath:
        paths = [os.path.abspath(p) for p in pythonpath]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
    dirs = []
    for binary in (ckptctl, ckptd):
        d = os.path.dirname(os.path.abspath(binary))
        if d not in dirs:
            dirs.append(d)
    env["PATH"] = os.pathsep.join(dirs + [env.get("PATH", "/usr/local/bin:/usr/bin:/bin")])
    return env


def run_document(doc_path: str, ckptd: str, ckptctl: str, name: str, timeout: float,
                 out=sys.stdout, python: Optional[str] = None,
                 pythonpath: Sequence[str] = ()) -> int:
    """Runs the examples of one document; returns the process exit code (0: all passed)."""
    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    doc_label = os.path.basename(doc_path)
    ckptd, ckptctl = os.path.abspath(ckptd), os.path.abspath(ckptctl)  # they run in a temp dir
    try:
        with open(doc_path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        say("ERROR cannot read %s: %s" % (doc_path, e.strerror))
        say("%s: 0 passed, 0 failed, 1 document error" % name)
        return 1
    examples, errors = parse_document(text)
    if errors:
        for error in errors:
            say("ERROR %s" % error.format(doc_label))
        say("%s: 0 passed, 0 failed, %d document error%s"
            % (name, len(errors), "" if len(errors) == 1 else "s"))
        return 1
    for binary in (ckptd, ckptctl):
        if not os.access(binary, os.X_OK):
            say("ERROR %s is not an executable file" % binary)
            say("%s: 0 passed, 0 failed, 1 setup error" % name)
            return 1

    base = tempfile.mkdtemp(prefix=name + "-")
    server: Optional[Server] = None
    passed = failed = 0
    setup_errors: List[str] = []
    try:
        workdir = os.path.join(base, "work")
        os.mkdir(workdir)
        workdirs = [workdir, os.path.realpath(workdir)]
        env = _environment(ckptd, ckptctl, pythonpath)
        server = Server(ckptd, workdir, os.path.join(base, "ckptd-data"),
                        os.path.join(base, "ckptd.port"), os.path.join(base, "ckptd.log"), env)
        server.wait_listening(timeout=30)
        env["CKPT_SERVER"] = "127.0.0.1:%d" % server.port
        say("ckptd listening on %s; working directory %s" % (env["CKPT_SERVER"], workdir))
        for example in examples:
            if example.script:
                script_path = os.path.join(base, "%s-line-%d.py" % (
                    re.sub(r"[^\w.-]", "_", doc_label), example.line))
                result = run_script(example.command, script_path, python or sys.executable,
                                    workdir, env, timeout)
            else:
                result = run_command(example.command, workdir, env, timeout)
            want_failure = example.expects_failure()
            expected_status = "non-zero" if want_failure else "0"
            if result.status is None:
                status_text = "timed out after %.0f s" % timeout
            else:
                status_text = "exit status %d (expected %s)" % (result.status, expected_status)
            status_ok = result.status is not None and (result.status != 0) == want_failure
            output_ok = output_matches(example.expected, result.output, workdirs)
            where = "%s:%d" % (doc_label, example.line)
            if status_ok and output_ok:
                passed += 1
                say("ok   %s  %s%s" % (where, "" if example.script else "$ ",
                                         example.first_line()))
                continue
            failed += 1
            say("FAIL %s  %s%s" % (where, "" if example.script else "$ ", example.first_line()))
            if example.script:
                say(_indent("script:\n" + _indent(example.command.rstrip("\n"), "  > ")))
            elif "\n" in example.command:
                say(_indent("command:\n" + _indent(example.command, "  $ ")))
            say(_indent("%s; output %s" % (status_text, "as expected" if output_ok else "differs")))
            if not output_ok:
                say(_indent(output_diff(
                    example.expected, result.output, workdirs,
                    "expected (%s:%d)" % (doc_label, example.expected_line()), "actual")))
            else:
                say(_indent("\n".join(result.output) if result.output else "(no output)", "  | "))
    except (RuntimeError, OSError) as e:
        setup_errors.append(str(e))
    except KeyboardInterrupt:
        setup_errors.append("interrupted")
    except SystemExit as e:  # SIGTERM (_terminate)
        setup_errors.append("terminated (exit %s)" % e.code)
    finally:
        if server is not None:
            problem = server.stop(timeout=30)
            if problem:
                setup_errors.append(problem)
        for error in setup_errors:
            say("ERROR %s" % error)
        if server is not None and (setup_errors or failed):
            tail = server.log_tail()
            if tail:
                say("last lines of ckptd's log:")
                say(_indent(tail))
        shutil.rmtree(base, ignore_errors=True)
    summary = "%s: %d passed, %d failed" % (name, passed, failed)
    if setup_errors:
        summary += ", %d setup error%s" % (len(setup_errors), "" if len(setup_errors) == 1 else "s")
    say(summary)
    return 0 if not failed and not setup_errors else 1


def _terminate(signum, _frame):
    # Turns SIGTERM (e.g. from ctest's timeout) into an exception so that cleanup runs.
    raise SystemExit(128 + signum)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckptd", required=True, help="the ckptd binary to start")
    parser.add_argument("--ckptctl", required=True, help="the ckptctl binary the examples run")
    parser.add_argument("--name", help="name in the summary line (default: the document's name)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds each command may run (default 120)")
    parser.add_argument("--python", help="interpreter of ```python run blocks (default: the one "
                        "running this script)")
    parser.add_argument("--pythonpath", action="append", default=[],
                        help="directory put first on PYTHONPATH for every example (repeatable)")
    parser.add_argument("document", help="Markdown file whose examples to run")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    name = args.name or os.path.basename(args.document)
    return run_document(args.document, args.ckptd, args.ckptctl, name, args.timeout,
                        python=args.python, pythonpath=args.pythonpath)


if __name__ == "__main__":
    sys.exit(main())
