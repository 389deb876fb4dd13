"""Running the ``detr-peg`` command line in its own process, as a user does.

Two ways, same result:

* **cold**: ``python -m detr_peg.cli.main ARGS`` in a fresh interpreter;
* **warm** (default on Linux): one helper process (this file run as a script)
  imports torch, torchvision, the command modules and what they load on first
  use once, then forks a child per command (or per script of ``tools/``,
  ``python SCRIPT ARGS``). The child changes into the requested folder,
  takes the requested environment and limits, points its stdout/stderr at
  files and runs ``detr_peg.cli.main``
  (or the script) as ``__main__`` (``runpy``, what ``python -m`` does);
  an uncaught exception prints Python's usual traceback and exits with 1, as
  the interpreter would. Each child starts from the same freshly imported
  state, so nothing leaks from one command to the next.

Starting torch takes 3 to 7 seconds on a busy 2-core machine, which a matrix
of forty failing commands cannot afford; forking a warm interpreter takes
milliseconds (with the helper's objects frozen out of the garbage collector's
scans, ``gc.freeze``, so a child does not copy the helper's memory when it
collects). ``DETR_PEG_TEST_COLD_CLI=1`` runs every command cold, and
``test_bad_input_matrix`` always runs a few cases both ways and compares them.

Process limits a test can ask for (``limits``):

* ``("fsize", n)``: ``RLIMIT_FSIZE`` of ``n`` bytes with ``SIGXFSZ`` ignored,
  so writing past ``n`` bytes fails with ``EFBIG`` like a full disk;
* ``("memory", n)``: ``RLIMIT_AS`` at the process's present address space
  plus ``n`` bytes, so an allocation past that fails as on a full machine;
* ``("open_files", soft, hard)``: ``RLIMIT_NOFILE`` (``ulimit -n``);
* ``("no_dac_override",)``: drop ``CAP_DAC_OVERRIDE`` and
  ``CAP_DAC_READ_SEARCH``, so file permissions apply even to root.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def checkout_pythonpath() -> str:
    """``PYTHONPATH`` for a child process: this checkout first, ahead of whatever ``PYTHONPATH`` already holds
    (packages installed with ``--target``, say), which a child that replaced it could no longer import."""
    return os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


#: Environment of every command: single-threaded (small models, shared machine), this checkout first on the import path.
BASE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": checkout_pythonpath()}

#: A process limit, e.g. ``("fsize", 4096)`` (see the module docstring).
Limit = tuple


@dataclass
class CliResult:
    """One finished command.

    Attributes:
        returncode: exit status, or ``-signal`` when a signal ended it.
        stdout: what it printed on stdout.
        stderr: what it printed on stderr.
        mode: ``"cold"`` or ``"warm"``.
    """

    returncode: int
    stdout: str
    stderr: str
    mode: str

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


# ------------------------------------------------------------------ limits


_CAP_DAC_OVERRIDE = 1
_CAP_DAC_READ_SEARCH = 2
_PR_CAPBSET_DROP = 24
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_file_access_override() -> None:
    """Drop ``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH`` from this process and whatever it executes.

    Raises:
        OSError: the kernel refused (no ``CAP_SETPCAP``, not Linux).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    mask = (1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):  # bounding set: also after execve
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    data[0].effective &= ~mask
    data[0].permitted &= ~mask
    data[0].inheritable &= ~mask
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def apply_limits(limits: Sequence[Limit]) -> None:
    """Apply ``limits`` (see the module docstring) to this process."""
    import resource

    for limit in limits:
        if limit[0] == "fsize":
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit[1]), resource.RLIM_INFINITY))
        elif limit[0] == "memory":
            with open("/proc/self/statm") as statm:
                present = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (present + int(limit[1]), resource.RLIM_INFINITY))
        elif limit[0] == "open_files":
            resource.setrlimit(resource.RLIMIT_NOFILE, (int(limit[1]), int(limit[2])))
        elif limit[0] == "no_dac_override":
            drop_file_access_override()
        else:
            raise ValueError(f"unknown limit {limit!r}")


def can_drop_file_access_override() -> str | None:
    """``None`` if :func:`drop_file_access_override` works here, else why not."""
    if not sys.platform.startswith("linux"):
        return "dropping capabilities needs Linux"
    pid = os.fork()
    if pid == 0:
        try:
            drop_file_access_override()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else "the kernel refused to drop CAP_DAC_OVERRIDE"


# ------------------------------------------------------------------ runners


def _child_env(env: dict[str, str] | None) -> dict[str, str]:
    return {**os.environ, **BASE_ENV, **(env or {})}


class CliRunner:
    """Runs ``detr-peg`` commands, and scripts, in child processes (see the module docstring).

    Args:
        mode: ``"warm"``, ``"cold"``, or ``None``: warm unless
            ``DETR_PEG_TEST_COLD_CLI=1`` or ``os.fork`` is missing.
    """

    def __init__(self, mode: str | None = None) -> None:
        if mode is None:
            cold = os.environ.get("DETR_PEG_TEST_COLD_CLI", "") not in ("", "0") or not hasattr(os, "fork")
            mode = "cold" if cold else "warm"
        self.mode = mode
        self._server: subprocess.Popen | None = None
        self._tmp = tempfile.TemporaryDirectory(prefix="detr-peg-cli-")
        self._count = 0
        self._active: CliProcess | None = None

    def run(self, args: Sequence[str], **options) -> CliResult:  # noqa: ANN003 - the options of start()
        """:meth:`start` ``detr-peg ARGS`` (or ``python SCRIPT ARGS``) with the same options, and wait for it."""
        return self.start(args, **options).wait()

    def start(
        self,
        args: Sequence[str],
        *,
        cwd: Path | str,
        env: dict[str, str] | None = None,
        limits: Sequence[Limit] = (),
        timeout: float = 300,
        script: str | None = None,
    ) -> CliProcess:
        """Start ``detr-peg ARGS`` in ``cwd``; signal it with ``send_signal``, collect it with ``wait``.

        With ``script``, ``python SCRIPT ARGS`` instead (a path relative to ``cwd``, as
        ``python`` takes it; the scripts of ``tools/``).
        """
        self._count += 1
        out = Path(self._tmp.name) / f"{self._count}.out"
        err = Path(self._tmp.name) / f"{self._count}.err"
        if self.mode == "cold":
            with open(out, "wb") as fo, open(err, "wb") as fe:
                proc = subprocess.Popen(
                    [sys.executable, *([script] if script else ["-m", "detr_peg.cli.main"]), *map(str, args)],
                    cwd=cwd,
                    env=_child_env(env),
                    stdin=subprocess.DEVNULL,
                    stdout=fo,
                    stderr=fe,
                    preexec_fn=(lambda: apply_limits(limits)) if limits else None,
                )
            return CliProcess(self, proc.pid, out, err, timeout, proc)
        server = self._start_server()
        if self._active is not None and self._active._result is None:
            raise RuntimeError("the command helper runs one command at a time; wait for the previous one")
        request = {
            "argv": [str(a) for a in args],
            "script": script,
            "cwd": str(cwd),
            "env": dict(env or {}),
            "limits": [list(limit) for limit in limits],
            "stdout": str(out),
            "stderr": str(err),
            "timeout": timeout,
        }
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        self._active = CliProcess(self, int(self._reply()["pid"]), out, err, timeout, None)
        return self._active

    def _reply(self) -> dict:
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError("the command helper died")
        return json.loads(line)

    def _start_server(self) -> subprocess.Popen:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve())],
                cwd=REPO_ROOT,
                env=_child_env(None),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
            ready = self._server.stdout.readline()
            if ready.strip() != "ready":
                raise RuntimeError(f"the command helper did not start: {ready!r}")
        return self._server

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.stdin.close()
            try:
                self._server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
        self._tmp.cleanup()


class CliProcess:
    """A started command (see :meth:`CliRunner.start`).

    Attributes:
        pid: its process id (a real process in both modes).
    """

    def __init__(
        self, runner: CliRunner, pid: int, out: Path, err: Path, timeout: float, popen: subprocess.Popen | None
    ) -> None:
        self.pid = pid
        self._runner, self._out, self._err, self._timeout, self._popen = runner, out, err, timeout, popen
        self._result: CliResult | None = None

    def send_signal(self, sig: int) -> None:
        if self._result is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended already; wait() collects it
                pass

    def poll(self) -> bool:
        """Whether it has ended (a warm command counts as running until the helper has collected it)."""
        if self._popen is not None:
            return self._popen.poll() is not None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def wait(self) -> CliResult:
        if self._result is None:
            if self._popen is not None:
                try:
                    code = self._popen.wait(timeout=self._timeout)
                except subprocess.TimeoutExpired:
                    self._popen.kill()
                    code = self._popen.wait()
                mode = "cold"
            else:
                code, mode = int(self._runner._reply()["returncode"]), "warm"
            self._result = CliResult(
                code, self._out.read_text(errors="replace"), self._err.read_text(errors="replace"), mode
            )
        return self._result


# ------------------------------------------------------------------ the helper process


def _child(request: dict) -> None:
    """In the forked child: become ``python -m detr_peg.cli.main ARGS`` (or ``python SCRIPT ARGS``) and exit."""
    import atexit
    import runpy
    import traceback

    code = 1
    try:
        fd_in = os.open(os.devnull, os.O_RDONLY)
        fd_out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fd_err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for fd, target in ((fd_in, 0), (fd_out, 1), (fd_err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        os.chdir(request["cwd"])
        script = request.get("script")
        # As ``python -m`` and ``python SCRIPT`` set it.
        sys.path[0] = os.path.dirname(os.path.abspath(script)) if script else os.getcwd()
        os.environ.update(request["env"])
        apply_limits([tuple(limit) for limit in request["limits"]])
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        sys.argv = [script or "detr-peg", *request["argv"]]
        try:
            if script:
                runpy.run_path(script, run_name="__main__")
            else:
                runpy.run_module("detr_peg.cli.main", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # what the interpreter does with an uncaught exception
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    """Import the command line once, then fork one child per request read from stdin."""
    import gc

    import detr_peg.cli.main as cli_main

    for module, _ in cli_main.available_commands().values():
        __import__(module)
    import detr_peg.engine.evaluation.run  # noqa: F401
    import detr_peg.engine.trainer  # noqa: F401
    import detr_peg.models.builder  # noqa: F401

    # What commands import on first use, once here rather than in every child (0.5 to 2 s each): the
    # matcher's scipy.optimize (every training), the Detector with its Hub support (eval, predict), and
    # the study's tables and figures (scipy.stats; matplotlib, whose backend plots.py sets to Agg).
    for module in ("scipy.optimize", "detr_peg.detector", "detr_peg.lab.study.runner", "detr_peg.lab.study.plots"):
        __import__(module)

    # ``python -m`` runs the module's code as ``__main__`` without importing it under its own name first.
    del sys.modules["detr_peg.cli.main"]
    del sys.modules["detr_peg.cli"].main
    # Everything imported so far is left out of the garbage collector's scans: a child's first collection
    # would otherwise write to every object torch and the commands created, copying the helper's memory
    # page by page (about 0.3 s of a 0.31 s failing command here; 0.01 s with the objects frozen).
    gc.freeze()
    reply = sys.stdout
    print("ready", file=reply, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        reply.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=reply, flush=True)
        code = _wait(pid, float(request["timeout"]))
        print(json.dumps({"returncode": code}), file=reply, flush=True)


def _wait(pid: int, timeout: float) -> int:
    """The exit status of child ``pid``; SIGKILL after ``timeout`` seconds (then ``-9``)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)


if __name__ == "__main__":
    sys.path[0] = str(REPO_ROOT)  # not this folder: the children import as ``python -m`` would
    _serve()
