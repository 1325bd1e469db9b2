"""Run many `devplug` command lines fast: one process imports the CLI once, then forks a
child per command line, which runs `devplug.cli.main.main` as the `devplug` script does,
with its own stdout, stderr and exit status.

    python tests/cli_runner.py < cases.json > results.json

Each case: {"argv": [...], "stdin": text or null, "block": [module, ...] (made
unimportable, as if not installed), "closed_stdout": bool (stdout a pipe nobody reads),
"env": {...}, "timeout": seconds, "term_in": prefix or null (SIGTERM is sent the moment
the command writes into a temporary folder it made whose name starts with prefix)}.
Each result: {"code": exit status, or null when killed at the timeout, "stdout": ...,
"stderr": ...}.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile


def terminate_when_writing_in(prefix: str) -> None:
    """SIGTERM to this process at its first write (a file opened, a folder made) in a
    temporary folder it made whose name starts with `prefix`: its state exists then."""
    folders: list[str] = []
    sent: list[bool] = []

    def hook(event: str, args: tuple[object, ...]) -> None:
        if sent:
            return
        if event == "tempfile.mkdtemp" and os.path.basename(str(args[0])).startswith(prefix):
            folders.append(str(args[0]) + os.sep)
        elif event in ("open", "os.mkdir") and folders and isinstance(args[0], str | bytes):
            path = os.fsdecode(args[0])
            writing = event == "os.mkdir" or "w" in str(args[1]) or "a" in str(args[1])
            if writing and any(path.startswith(f) for f in folders):
                sent.append(True)
                os.kill(os.getpid(), signal.SIGTERM)

    sys.addaudithook(hook)


def run_case(case: dict[str, object], scratch: str) -> dict[str, object]:
    out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
    in_path = os.path.join(scratch, "in")
    with open(in_path, "w") as f:
        f.write(str(case.get("stdin") or ""))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(int(case.get("timeout") or 20))  # default action: the child ends
            os.dup2(os.open(in_path, os.O_RDONLY), 0)
            if case.get("closed_stdout"):
                read, write = os.pipe()
                os.close(read)
                os.dup2(write, 1)
            else:
                os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            os.environ.update(case.get("env") or {})  # type: ignore[arg-type]
            tempfile.tempdir = None  # $TMPDIR read again
            if case.get("term_in"):
                terminate_when_writing_in(str(case["term_in"]))
            for module in case.get("block") or []:  # type: ignore[attr-defined]
                sys.modules[module] = None  # type: ignore[assignment]
            sys.argv = ["devplug", *case["argv"]]  # type: ignore[misc]
            from devplug.cli.main import main

            try:
                code = main(case["argv"])  # type: ignore[arg-type]
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            with contextlib.suppress(BrokenPipeError):  # as Python at exit: the reader left
                sys.stdout.flush()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 99
        finally:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)  # nothing left to flush into a closed pipe
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    with open(out_path, errors="replace") if os.path.exists(out_path) else open(os.devnull) as f:
        stdout = f.read()
    with open(err_path, errors="replace") if os.path.exists(err_path) else open(os.devnull) as f:
        stderr = f.read()
    for path in (out_path, err_path):
        if os.path.exists(path):
            os.unlink(path)
    return {
        "code": None if code == -signal.SIGALRM else code,
        "stdout": stdout,
        "stderr": stderr,
    }


def main() -> None:
    cases = json.load(sys.stdin)
    from devplug.cli.main import build_parser

    build_parser()  # every command module imported once, before the forks

    results = []
    with tempfile.TemporaryDirectory(prefix="dp-cli-") as scratch:
        for case in cases:
            results.append(run_case(case, scratch))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
