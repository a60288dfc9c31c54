"""Start node processes (`edgeinfer serve`, `edgeinfer control`) by forking a server that imported edgeinfer once.

A fresh `python -m edgeinfer ...` spends seconds importing torch before it runs a line of the node (about 3 s
on a 2-core CPU, more under load), and a process that starts many replays (the bench: scenarios x decode
modes x repeats) pays that per node and replay. Here one fork server, started on first use with this
process's environment and working directory, is `python -m edgeinfer fork-server`: the command line hands
serve_forks its own main and a preload (both callables: this layer sits below the command line and names
neither), the server calls preload once, and every node is an os.fork() of it that runs the very same
main(argv) a fresh interpreter would: a separate OS process with its
own sockets, stdout and stderr in a log file, a session of its own, the niceness of the thread that asked for it
(as a subprocess of that thread would have), and the EDGEINFER_PARENT_PID watch
(edgeinfer.core.lifecycle) naming the fork server, which exits when this process closes its end of the pipe (it
died), so orphaned nodes stop.

The fork server imports modules but runs nothing: it is single-threaded, and no torch thread pool, ZeroMQ
context or CUDA state exists in it when it forks. Requests and replies are JSON lines over its stdin/stdout
(no pickle): {"argv", "log", "cwd", "nice"} -> {"pid"} or {"error"}, and {"exit": pid, "code"} when a node exits
(code as subprocess.Popen.returncode: the exit status, or -N after signal N).
"""
from __future__ import annotations

import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from edgeinfer.core.lifecycle import PARENT_PID_ENV, exit_now

# the fork server's process: the program every node is (NodeSpec.argv), with its internal `fork-server` command
SERVER_ARGV = (sys.executable, "-m", "edgeinfer", "fork-server")
START_TIMEOUT_S = 300.0  # the server's imports on a loaded machine, and one fork


class ForkedNode:
    """A node forked by the fork server, with the subprocess.Popen methods a replay uses: pid, poll(),
    wait(timeout) (raises subprocess.TimeoutExpired), kill(), terminate(), returncode (None while running)."""

    def __init__(self, argv: list[str], log_path: Path):
        self.args = list(argv)
        self._server = _server()
        self.pid = self._server.fork(self.args, Path(log_path))

    @property
    def returncode(self) -> int | None:
        return self._server.codes.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self._server.exited:
            if not self._server.exited.wait_for(lambda: self.pid in self._server.codes, timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self._server.codes[self.pid]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped yet, so the pid is still this node's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Client:
    """This process's end of the fork server: requests one at a time; a reader thread files exit codes."""

    def __init__(self):
        self.proc = subprocess.Popen(SERVER_ARGV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     start_new_session=True)
        self.codes: dict[int, int] = {}
        self.pids: set[int] = set()  # every node forked
        self.exited = threading.Condition()
        self.replies: queue.Queue = queue.Queue()
        self.ready = threading.Event()  # the server has preloaded
        self.lock = threading.Lock()
        threading.Thread(target=self._read, name="forkserver-reader", daemon=True).start()

    def fork(self, argv: list[str], log_path: Path) -> int:
        """The pid of a new node running `edgeinfer <argv>` with its output in log_path. Raises RuntimeError."""
        # the niceness of the asking thread, as a subprocess of it would have (Linux: per thread), not the server's
        request = {"argv": argv, "log": str(log_path.resolve()), "cwd": os.getcwd(),
                   "nice": os.getpriority(os.PRIO_PROCESS, 0)}
        with self.lock:
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
                reply = self.replies.get(timeout=START_TIMEOUT_S)
            except (OSError, queue.Empty) as e:
                raise RuntimeError(f"fork server (pid {self.proc.pid}) did not start {argv[:1]}: {e!r}") from None
        if "pid" not in reply:
            raise RuntimeError(f"fork server could not start {argv[:1]}: {reply.get('error')}")
        self.pids.add(reply["pid"])
        return reply["pid"]

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "ready" in msg:
                self.ready.set()
            elif "exit" in msg:
                with self.exited:
                    self.codes[msg["exit"]] = msg["code"]
                    self.exited.notify_all()
            else:
                self.replies.put(msg)
        code = self.proc.wait()
        with self.exited:  # it died: its nodes cannot be reaped by it, so they are killed (and counted so) now
            for pid in self.pids - set(self.codes):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.codes[pid] = -signal.SIGKILL
            self.exited.notify_all()
        self.replies.put({"error": f"the fork server exited with code {code}"})
        self.ready.set()


def start(wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
    """Start this process's fork server now (ForkedNode otherwise starts it on first use) and, with wait,
    block until it has imported what the nodes share, so that its imports do not overlap what the caller
    measures next. Raises TimeoutError when it is not ready within timeout_s, RuntimeError when it died."""
    client = _server()
    if wait:
        if not client.ready.wait(timeout_s):
            raise TimeoutError(f"fork server (pid {client.proc.pid}) not ready after {timeout_s} s")
        if client.proc.poll() is not None:
            raise RuntimeError(f"fork server exited with code {client.proc.returncode} while preloading")


_client: _Client | None = None
_client_lock = threading.Lock()


def _server() -> _Client:
    global _client
    with _client_lock:
        if _client is None or _client.proc.poll() is not None:
            _client = _Client()
        return _client


def serve_forks(main: Callable[[list[str]], int], preload: Callable[[], None]) -> None:
    """The fork server's main loop (its own process): call `preload` (the imports the nodes share), then fork a
    node per request line on stdin, which runs `main(argv)` (the command line's), and report its pid, and every
    node's exit, on stdout; return at EOF on stdin."""
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # a stray print of an import must not corrupt the replies
    preload()
    replies.write(b'{"ready": true}\n')
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the select through wake_w
    stdin = sys.stdin.buffer
    while True:
        ready, _, _ = select.select([stdin, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(replies)
        if stdin in ready:
            line = stdin.readline()
            if not line:
                return  # the client is gone: so are we (our nodes see their parent change and stop)
            request = json.loads(line)
            try:
                pid = os.fork()
            except OSError as e:
                replies.write(json.dumps({"error": repr(e)}).encode() + b"\n")
                continue
            if pid == 0:
                _run_node(main, request, closing=(wake_r, wake_w, replies.fileno()))
            replies.write(json.dumps({"pid": pid}).encode() + b"\n")
            _reap(replies)


def _take_niceness(nice: int | None) -> None:
    """Run at `nice` (None: as forked); lowering it below the server's needs CAP_SYS_NICE or RLIMIT_NICE: without
    them the node keeps the server's, as `nice` would."""
    if nice is None or nice == os.getpriority(os.PRIO_PROCESS, 0):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:  # PermissionError without CAP_SYS_NICE
        pass


def _reap(replies) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        replies.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def _run_node(main: Callable[[list[str]], int], request: dict, closing: tuple[int, ...]) -> None:
    """In the forked child: main(request's argv); never returns (os._exit with the node's exit code)."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        os.setsid()
        _take_niceness(request.get("nice"))
        os.chdir(request["cwd"])
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ[PARENT_PID_ENV] = str(os.getppid())  # the fork server: it exits with our starter
        code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        exit_now(code if isinstance(code, int) else 1)
