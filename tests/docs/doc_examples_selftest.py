#!/usr/bin/python3
"""Self-test of run_doc_examples.py: its Markdown parser, its output matcher and, with stand-in
binaries (a fake ckptd that listens and records how it was stopped), its runner end to end.

Every check asserts both a case that must pass and one that must fail, so that a matcher that
accepts everything (or nothing) is caught. Standard library only; registered in ctest as
docs_selftest.
"""

import io
import os
import stat
import sys
import tempfile
import textwrap
import unittest

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_doc_examples as rde  # noqa: E402


def doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def matches(expected: str, actual: str, workdirs=()) -> bool:
    return rde.output_matches(doc(expected).split("\n"), doc(actual).split("\n"), workdirs)


NO_COMMAND = ("doc.md: no runnable command: no `$ ` line in any ```console block and no "
              "```python run block")


class ParserTest(unittest.TestCase):

    def parse_ok(self, text):
        examples, errors = rde.parse_document(doc(text))
        self.assertEqual(errors, [])
        return examples

    def errors_of(self, text):
        return [e.format("doc.md") for e in rde.parse_document(doc(text))[1]]

    def test_commands_and_expected_output(self):
        examples = self.parse_ok("""
            Intro text.

            ```console
            $ ckptctl sample sample
            wrote sample/...

            $ mkdir -p out
            $ echo a; echo b
            a
            b
            ```
            """)
        self.assertEqual([e.command for e in examples],
                         ["ckptctl sample sample", "mkdir -p out", "echo a; echo b"])
        self.assertEqual([e.line for e in examples], [4, 7, 8])
        self.assertEqual(examples[0].expected, ["wrote sample/...", ""])
        self.assertEqual(examples[1].expected, [])
        self.assertEqual(examples[2].expected, ["a", "b"])
        self.assertEqual(examples[2].expected_line(), 9)

    def test_only_console_blocks_run(self):
        examples = self.parse_ok("""
            ```sh
            $ make run
            ```
            ```text
            $ echo not run
            ```
            ```console
            $ echo run
            run
            ```
            ~~~
            $ echo not run either
            ~~~
            """)
        self.assertEqual([e.command for e in examples], ["echo run"])

    def test_continuation_lines(self):
        examples = self.parse_ok("""
            ```console
            $ ckptctl fetch demo --merged \\
                --out out/m.ckpt
            fetched ...
            $ echo one \\
            two \\
            three
            one two three
            ```
            """)
        self.assertEqual(examples[0].command, "ckptctl fetch demo --merged \\\n    --out out/m.ckpt")
        self.assertEqual(examples[0].expected, ["fetched ..."])
        self.assertEqual(examples[0].expected_line(), 4)
        self.assertEqual(examples[1].command, "echo one \\\ntwo \\\nthree")
        self.assertEqual(examples[1].expected, ["one two three"])
        # The joined command is what bash runs: its continuation lines join as in a terminal.
        result = rde.run_command(examples[1].command, tempfile.gettempdir(), dict(os.environ), 30)
        self.assertEqual((result.status, result.output), (0, ["one two three"]))

    def test_continuation_past_end_of_block_is_an_error(self):
        self.assertEqual(self.errors_of("""
            ```console
            $ echo a \\
            ```
            """), ["doc.md:2: command continues (` \\`) past the end of its block"])

    def test_indented_block_in_a_list(self):
        examples = self.parse_ok("""
            - item:

              ```console
              $ echo hi
              hi
              ```
            """)
        self.assertEqual(examples[0].command, "echo hi")
        self.assertEqual(examples[0].expected, ["hi"])

    def test_longer_fence_holds_a_shorter_one(self):
        examples = self.parse_ok("""
            ````markdown
            ```console
            $ echo inside markdown
            ```
            ````
            ```console
            $ echo real
            ```
            """)
        self.assertEqual([e.command for e in examples], ["echo real"])

    def test_escaped_ckptctl_lines_are_errors(self):
        errors = self.errors_of("""
            ```console
            $ ckptctl ls
            ```

            ```
            $ ckptctl deps --src-strategy a --dst-strategy b --rank 3
            ckptctl: OUT_OF_RANGE: ...
            ```

            ```sh
            $ ckptctl ls
            ```

                $ ckptctl describe demo

            `$ ckptctl` in prose is fine, as is "$ make run" in a sh block.
            """)
        self.assertEqual(len(errors), 3, errors)
        self.assertTrue(errors[0].startswith("doc.md:6: `$ ckptctl` line in a plain ``` block"),
                        errors[0])
        self.assertTrue(errors[1].startswith("doc.md:11: `$ ckptctl` line in a ```sh block"),
                        errors[1])
        self.assertTrue(errors[2].startswith("doc.md:14: `$ ckptctl` line outside"), errors[2])

    def test_document_without_commands_is_an_error(self):
        self.assertEqual(self.errors_of("""
            # Title

            ```sh
            make test
            ```
            """), [NO_COMMAND])
        self.assertEqual(self.errors_of(""), [NO_COMMAND])
        # A python block without the `run` word is not a runnable example either.
        self.assertEqual(self.errors_of("""
            ```python
            print("not run")
            ```
            """), [NO_COMMAND])

    def test_python_run_blocks_and_their_output(self):
        examples = self.parse_ok("""
            ```python run
            print("a")
            print("b")
            ```

            ```text
            a
            b
            ```
            ```python
            print("signature only, not run")
            ```
            ```console
            $ echo x
            x
            ```
            ```python run
            import sys
            ```
            Text between: the text block below is not its output.

            ```text
            not output
            ```
            """)
        self.assertEqual([e.script for e in examples], [True, False, True])
        self.assertEqual(examples[0].command, 'print("a")\nprint("b")\n')
        self.assertEqual(examples[0].expected, ["a", "b"])
        self.assertEqual(examples[0].line, 1)
        self.assertEqual(examples[0].expected_line(), 7)
        self.assertEqual(examples[0].first_line(), "python (2 lines)")
        self.assertEqual(examples[2].command, "import sys\n")
        self.assertEqual(examples[2].expected, [])
        # A script must exit 0 even if its output shows a ckptctl error line.
        script = self.parse_ok("""
            ```python run
            print("ckptctl: NOT_FOUND: shown by the script")
            ```

            ```text
            ckptctl: NOT_FOUND: shown by the script
            ```
            """)[0]
        self.assertFalse(script.expects_failure())

    def test_unclosed_fence_and_stray_output_are_errors(self):
        errors = self.errors_of("""
            ```console
            output first
            $ echo x
            x
            ```
            ```console
            $ echo y
            """)
        self.assertEqual(errors, [
            "doc.md:2: output line before the first `$ ` command of a console block",
            "doc.md:6: fenced block is never closed",
        ])


class ExpectedFailureTest(unittest.TestCase):

    def test_detection(self):
        self.assertTrue(rde.expects_failure(["ckptctl: NOT_FOUND: checkpoint x not found"]))
        self.assertTrue(rde.expects_failure(["warning: ...", "ckptctl: FAILED_PRECONDITION: x"]))
        self.assertTrue(rde.expects_failure(["ckptctl: error: unknown flag"]))
        self.assertTrue(rde.expects_failure(["ckptctl: INVALID_ARGUMENT"]))
        self.assertFalse(rde.expects_failure(["fetched 11 tensors"]))
        self.assertFalse(rde.expects_failure([]))
        self.assertFalse(rde.expects_failure(["ckptctl: OK"]))
        self.assertFalse(rde.expects_failure(["ckptctl: NOT_A_CODE: x"]))
        self.assertFalse(rde.expects_failure(["  ckptctl: NOT_FOUND: indented"]))
        self.assertFalse(rde.expects_failure(["ckptctl: errors found"]))
        self.assertFalse(rde.expects_failure(["see ckptctl: NOT_FOUND"]))


class MatcherTest(unittest.TestCase):

    def test_exact_lines(self):
        self.assertTrue(matches("a\nb", "a\nb"))
        self.assertFalse(matches("a\nb", "a\nc"))
        self.assertFalse(matches("a\nb", "a"))
        self.assertFalse(matches("a", "a\nb"))
        self.assertFalse(matches("b\na", "a\nb"))

    def test_trailing_whitespace_and_blank_lines(self):
        self.assertTrue(matches("a  \nb\n\n", "a\nb   \n"))
        self.assertFalse(matches("a\n\nb", "a\nb"))  # an inner blank line is a line
        self.assertFalse(rde.output_matches([" a"], ["a"]))  # leading whitespace counts

    def test_no_expected_output_means_no_output(self):
        self.assertTrue(rde.output_matches([], []))
        self.assertTrue(rde.output_matches([""], [""]))
        self.assertFalse(rde.output_matches([], ["something"]))

    def test_ellipsis_line_matches_any_number_of_lines(self):
        self.assertTrue(matches("first\n...\nlast", "first\nlast"))
        self.assertTrue(matches("first\n...\nlast", "first\nx\ny\nz\nlast"))
        self.assertTrue(matches("...", ""))
        self.assertTrue(matches("...", "anything\nat all"))
        self.assertTrue(matches("a\n...", "a\nb\nc"))
        self.assertTrue(matches("...\nc", "a\nb\nc"))
        self.assertTrue(matches("a\n...\nx\n...\nz", "a\n1\nx\n2\n3\nz"))
        # Backtracking: the first "x" candidate is not the right one.
        self.assertTrue(matches("...\nx\nend", "x\nx\nend"))
        self.assertFalse(matches("first\n...\nlast", "first\nx\nlast but not least"))
        self.assertFalse(matches("first\n...\nlast", "x\nfirst\nlast"))
        self.assertFalse(matches("a\n...\nx\n...\nz", "a\n1\n2\nz"))
        self.assertFalse(matches("...\nc", "a\nb"))
        # Only a line that is exactly "..." spans lines; an indented one is an in-line wildcard.
        self.assertTrue(matches("{\n  ...", "{\n  \"a\": 1"))
        self.assertFalse(matches("{\n  ...", "{\n  \"a\": 1,\n  \"b\": 2"))

    def test_ellipsis_inside_a_line(self):
        self.assertTrue(matches("wrote sample/src (8 ranks: ...", "wrote sample/src (8 ranks: 4 x 2)"))
        self.assertTrue(matches("submitted job ...: demo -> x", "submitted job job-1a2b: demo -> x"))
        self.assertTrue(matches("a...b...c", "abc"))
        self.assertTrue(matches("a...b...c", "a 1 b 2 c"))
        self.assertTrue(matches("x ...", "x "))  # trailing whitespace is stripped on both sides
        self.assertTrue(matches("ranks: ...", "ranks:"))
        self.assertTrue(matches("ranks: ...", "ranks: 0 1"))
        self.assertFalse(matches("ranks: ...", "ranksx"))
        self.assertFalse(matches("ranks: ...", "rank"))
        self.assertFalse(matches("submitted job ...: demo -> x", "submitted job j1: demo -> y"))
        self.assertFalse(matches("a...c", "a\nc"))  # never across lines
        self.assertFalse(matches("a...b...c", "a 1 c 2 b"))
        # Regular-expression characters are literal.
        self.assertTrue(matches("ranks [0, 1] (x)...", "ranks [0, 1] (x) more"))
        self.assertFalse(matches("ranks [0, 1] (x)...", "ranks 0 (x) more"))
        self.assertFalse(matches("a.b", "axb"))

    def test_addresses(self):
        self.assertTrue(matches("ckptd at 127.0.0.1:50051: down", "ckptd at 127.0.0.1:39123: down"))
        self.assertTrue(matches("listening on localhost:1", "listening on localhost:65535"))
        self.assertTrue(matches("at 127.0.0.1:<port>", "at 127.0.0.1:4242"))
        self.assertFalse(matches("ckptd at 127.0.0.1:50051", "ckptd at 10.0.0.1:50051"))
        self.assertFalse(matches("ckptd at 127.0.0.1:50051", "ckptd at localhost:50051"))
        self.assertFalse(matches("port 50051", "port 39123"))  # a bare number is not normalised

    def test_durations(self):
        self.assertTrue(matches("done in 1.2 s", "done in 35 ms"))
        self.assertTrue(matches("done in 0s", "done in 1m05s"))
        self.assertTrue(matches("eta 3h07m", "eta 2s"))
        self.assertTrue(matches("took 250ms.", "took 1.5s."))
        self.assertTrue(matches("(12 us)", "(3 min)"))
        self.assertFalse(matches("done in 1.2 s", "done in 1.2 GiB"))
        self.assertFalse(matches("done in 0s", "done at 0s"))
        # Counts followed by words are not durations.
        self.assertFalse(matches("4 devices x 2 stages", "4 devices x 3 stages"))
        self.assertFalse(matches("8 ranks", "9 ranks"))
        self.assertFalse(matches("9320 stored", "9408 stored"))
        self.assertFalse(matches("1 stage(s)", "2 stage(s)"))

    def test_rates(self):
        self.assertTrue(matches("at 1.3 GiB/s", "at 850 MiB/s"))
        self.assertTrue(matches("[====] 12.0 KiB/48.0 KiB  3.1 MiB/s", "[====] 12.0 KiB/48.0 KiB  900 B/s"))
        self.assertFalse(matches("at 1.3 GiB/s", "at 1.3 GiB"))
        self.assertFalse(matches("12.0 KiB/48.0 KiB", "13.0 KiB/48.0 KiB"))  # sizes are kept

    def test_timestamps(self):
        self.assertTrue(matches("created=2026-11-22T20:00:27Z", "created=2031-01-02T03:04:05Z"))
        self.assertTrue(matches("2026-11-22T20:00:26.149 info x", "2027-01-01T00:00:00.001 info x"))
        self.assertTrue(matches("on 2026-11-22", "on 2030-02-28"))
        self.assertTrue(matches("at 2026-11-22 20:00:27+01:00", "at 2026-11-23 08:00:00Z"))
        self.assertFalse(matches("created=2026-11-22T20:00:27Z info", "created=2026-11-22T20:00:27Z warn"))
        self.assertFalse(matches("id 20261122-200029", "id 20261123-200029"))

    def test_working_directory(self):
        work = ["/tmp/docs_x-abc/work", "/private/tmp/docs_x-abc/work"]
        self.assertTrue(matches("export $PWD/out/e done", "export /tmp/docs_x-abc/work/out/e done", work))
        self.assertTrue(matches("export ${PWD}/out/e", "export /private/tmp/docs_x-abc/work/out/e", work))
        self.assertTrue(matches("in $PWD", "in /tmp/docs_x-abc/work", work))
        self.assertFalse(matches("export $PWD/out/e", "export /tmp/other/work/out/e", work))
        self.assertFalse(matches("export $PWD/out/e", "export /tmp/docs_x-abc/work/out/f", work))

    def test_mismatch_diff_shows_real_differences_only(self):
        expected = ["submitted job ...: demo", "...", "took 1.2 s", "rank 0: 0 4 6"]
        actual = ["submitted job j-1: demo", "progress", "took 35 ms", "rank 0: 0 4 7"]
        self.assertFalse(rde.output_matches(expected, actual))
        diff = rde.output_diff(expected, actual)
        self.assertIn("-rank 0: 0 4 6", diff)
        self.assertIn("+rank 0: 0 4 7", diff)
        self.assertNotIn("+submitted job j-1", diff)  # matched its pattern: shown as written
        self.assertNotIn("+took 35 ms", diff)


FAKE_CKPTD = r'''#!/usr/bin/python3
# Stand-in for ckptd: listens where --listen says, writes --port-file, records how it stopped.
import os, signal, socket, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
marker = os.environ["FAKE_CKPTD_MARKER"]
with open(marker, "w") as f:
    f.write("started cwd=%s data=%s\n" % (os.getcwd(), args["--data"]))
def stop(signum, frame):
    with open(marker, "a") as f:
        f.write("SIGTERM\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
host, port = args["--listen"].rsplit(":", 1)
s = socket.socket()
s.bind((host, int(port)))
s.listen(16)
with open(args["--port-file"] + ".tmp", "w") as f:
    f.write("%d\n" % s.getsockname()[1])
os.rename(args["--port-file"] + ".tmp", args["--port-file"])
while True:
    conn, _ = s.accept()
    conn.close()
'''

FAKE_CKPTCTL = r'''#!/bin/bash
# Stand-in for ckptctl: "fail" prints a ckptctl error and exits 1, anything else echoes.
if [ "$1" = fail ]; then echo "ckptctl: NOT_FOUND: no such thing" >&2; exit 1; fi
echo "ckptctl $* (server $CKPT_SERVER)"
'''


class RunnerTest(unittest.TestCase):
    """run_document end to end, with fake binaries."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="doc_examples_selftest-")
        self.addCleanup(self.tmp.cleanup)
        bindir = os.path.join(self.tmp.name, "bin")
        os.mkdir(bindir)
        self.ckptd = self.write(os.path.join(bindir, "ckptd"), FAKE_CKPTD, executable=True)
        self.ckptctl = self.write(os.path.join(bindir, "ckptctl"), FAKE_CKPTCTL, executable=True)
        self.marker = os.path.join(self.tmp.name, "ckptd.marker")
        os.environ["FAKE_CKPTD_MARKER"] = self.marker
        self.addCleanup(os.environ.pop, "FAKE_CKPTD_MARKER", None)

    def write(self, path, text, executable=False):
        with open(path, "w") as f:
            f.write(text)
        if executable:
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return path

    def run_doc(self, text, timeout=30, pythonpath=()):
        path = self.write(os.path.join(self.tmp.name, "doc.md"), doc(text))
        out = io.StringIO()
        status = rde.run_document(path, self.ckptd, self.ckptctl, "docs_t", timeout, out=out,
                                  pythonpath=pythonpath)
        return status, out.getvalue()

    def assert_server_stopped_and_cleaned(self):
        with open(self.marker) as f:
            started, stopped = f.read().splitlines()
        self.assertEqual(stopped, "SIGTERM")
        work = started.split(" ")[1][len("cwd="):]
        self.assertTrue(work.endswith("/work"), started)
        self.assertFalse(os.path.exists(os.path.dirname(work)), "temporary directory left behind")

    def test_passing_document(self):
        status, out = self.run_doc("""
            ```console
            $ ckptctl ls
            ckptctl ls (server 127.0.0.1:1234)
            $ mkdir -p out && cd out && pwd
            $PWD/out
            $ touch a b
            $ ls
            a
            b
            out
            $ ckptctl fail
            ckptctl: NOT_FOUND: ...
            $ which ckptctl ckptd | xargs -n1 dirname | uniq | wc -l
            1
            $ echo out; echo err >&2; echo out2
            out
            err
            out2
            ```
            """)
        self.assertEqual(status, 0, out)
        self.assertEqual(out.rstrip("\n").split("\n")[-1], "docs_t: 7 passed, 0 failed")
        self.assert_server_stopped_and_cleaned()

    def test_python_scripts_run_in_order_with_the_environment(self):
        libdir = os.path.join(self.tmp.name, "lib")
        os.mkdir(libdir)
        self.write(os.path.join(libdir, "docmod.py"), "GREETING = 'hello from docmod'\n")
        status, out = self.run_doc("""
            ```console
            $ echo written > file.txt
            ```
            ```python run
            import os, docmod
            print(docmod.GREETING)
            print(open("file.txt").read().strip(), os.environ["CKPT_SERVER"])
            open("from_python.txt", "w").write("py\\n")
            ```

            ```text
            hello from docmod
            written 127.0.0.1:...
            ```
            ```console
            $ cat from_python.txt
            py
            ```
            """, pythonpath=[libdir])
        self.assertEqual(status, 0, out)
        self.assertIn("ok   doc.md:4  python (4 lines)", out)
        self.assertEqual(out.rstrip("\n").split("\n")[-1], "docs_t: 3 passed, 0 failed")

    def test_python_script_failures(self):
        status, out = self.run_doc("""
            ```python run
            print("other")
            ```

            ```text
            expected
            ```
            ```python run
            raise SystemExit("broken")
            ```
            ```python run
            print("unexpected")
            ```
            ```python run
            pass
            ```
            """)
        self.assertEqual(status, 1, out)
        self.assertIn("FAIL doc.md:1  python (1 lines)", out)
        self.assertIn("-expected", out)
        self.assertIn("FAIL doc.md:8  python (1 lines)", out)
        self.assertIn("exit status 1 (expected 0)", out)
        self.assertIn("FAIL doc.md:11  python (1 lines)", out)
        self.assertIn("+unexpected", out)
        self.assertEqual(out.rstrip("\n").split("\n")[-1], "docs_t: 1 passed, 3 failed")

    def test_output_mismatch_fails_with_a_diff(self):
        status, out = self.run_doc("""
            Text.

            ```console
            $ echo one; echo two
            one
            three
            $ echo fine
            fine
            ```
            """)
        self.assertEqual(status, 1, out)
        self.assertIn("FAIL doc.md:4  $ echo one; echo two", out)
        self.assertIn("--- expected (doc.md:5)", out)
        self.assertIn("-three", out)
        self.assertIn("+two", out)
        self.assertIn("ok   doc.md:7  $ echo fine", out)
        self.assertEqual(out.rstrip("\n").split("\n")[-1], "docs_t: 1 passed, 1 failed")
        self.assert_server_stopped_and_cleaned()

    def test_exit_status_is_checked(self):
        status, out = self.run_doc("""
            ```console
            $ false
            $ ckptctl ok
            ckptctl: NOT_FOUND: ...
            $ ckptctl fail
            ckptctl: NOT_FOUND: no such thing
            ```
            """)
        self.assertEqual(status, 1, out)
        self.assertIn("FAIL doc.md:2  $ false\n    exit status 1 (expected 0); output as expected", out)
        self.assertIn("FAIL doc.md:3  $ ckptctl ok\n    exit status 0 (expected non-zero); output differs", out)
        self.assertEqual(out.rstrip("\n").split("\n")[-1], "docs_t: 1 passed, 2 failed")

    def test_unexpected_output_of_a_silent_command_fails(self):
        status, out = self.run_doc("""
            ```console
            $ echo surprise
            ```
            """)
        self.assertEqual(status, 1, out)
        self.assertIn("+surprise", out)

    def test_timeout(self):
        status, out = self.run_doc("""
            ```console
            $ sleep 30
            ```
            """, timeout=1)
        self.assertEqual(status, 1, out)
        self.assertIn("timed out after 1 s", out)
        self.assert_server_stopped_and_cleaned()

    def test_document_errors_fail_without_running(self):
        status, out = self.run_doc("""
            ```console
            $ touch ran
            ```

            ```
            $ ckptctl ls
            ```
            """)
        self.assertEqual(status, 1, out)
        self.assertIn("ERROR doc.md:6: `$ ckptctl` line in a plain ``` block", out)
        self.assertEqual(out.rstrip("\n").split("\n")[-1],
                         "docs_t: 0 passed, 0 failed, 1 document error")
        self.assertFalse(os.path.exists(self.marker), "ckptd started for a malformed document")

    def test_missing_document(self):
        out = io.StringIO()
        status = rde.run_document(os.path.join(self.tmp.name, "absent.md"), self.ckptd,
                                  self.ckptctl, "docs_t", 30, out=out)
        self.assertEqual(status, 1)
        self.assertIn("cannot read", out.getvalue())

    def test_server_that_never_listens(self):
        self.write(self.ckptd, "#!/bin/sh\necho cannot open store >&2\nexit 1\n")
        status, out = self.run_doc("""
            ```console
            $ true
            ```
            """)
        self.assertEqual(status, 1, out)
        self.assertIn("ckptd exited with status 1 before listening", out)
        self.assertIn("cannot open store", out)  # its log is shown


if __name__ == "__main__":
    unittest.main()
