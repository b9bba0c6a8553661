"""Disposable child processes, the GPU workers of every tuning: a Child runs the functions it is sent,
one at a time, keeping its state (a CUDA context, buffers) between calls; a GpuProcess is the Child of
one GPU, started again after a call that kills it (a kernel that faults poisons its process's CUDA
context), and killed after one silent for its timeout. On this host there is one per GPU (runner.py);
on a Dask cluster one per GPU worker (distributed.py). A Child is a subprocess, not a
multiprocessing child, since Dask's worker processes are daemons, which multiprocessing forbids to
have children; and it leaves Ctrl-C to its parent, which stops it.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys


class ChildDied(RuntimeError):
    def __init__(self, code):
        super().__init__(f"the child process died (exit code {code})")
        self.code = code


class ChildTimeout(RuntimeError):
    pass


def ignore_interrupts() -> None:
    """In a worker process: leave Ctrl-C to the parent, which stops the workers and exits with
    one line (a worker taking SIGINT too would print a traceback of its own)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _write(stream, value) -> None:
    data = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


_retire = False  # set by a function whose failure poisoned this process (a CUDA fault)


def retire_after_reply() -> None:
    """Ends this child once its reply is sent: the next call gets a fresh process."""
    global _retire
    _retire = True


def _serve() -> None:
    """A child's loop: run each (function, args) sent on stdin, send back the result."""
    ignore_interrupts()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything the functions print goes to stderr, not into the replies
    requests = sys.stdin.buffer
    while (request := _read(requests)) is not None:
        function, args = request
        try:
            reply = ("ok", function(*args))
        except Exception as exc:  # noqa: BLE001 - sent back, the child lives on
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:500]}")
        _write(out, reply)
        if _retire:
            os._exit(3)


class Child:
    """A Python process that runs the functions it is sent (picklable, importable), one at a time."""

    def __init__(self, env: dict[str, str] | None = None):
        env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from gemmgen.tuning.child import _serve; _serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def call(self, function, args: tuple, timeout: float | None = None):
        try:
            _write(self.process.stdin, (function, args))
            ready, _, _ = select.select([self.process.stdout], [], [], timeout)
            if not ready:
                raise ChildTimeout(f"no result within {timeout:.0f} s")
            reply = _read(self.process.stdout)
        except (BrokenPipeError, EOFError, pickle.UnpicklingError, ValueError):
            reply = None
        if reply is None:
            raise ChildDied(self.process.wait())
        status, value = reply
        if status == "error":
            raise RuntimeError(value)
        return value

    def kill(self) -> None:
        if self.alive:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _guarded(function, *args):
    """In the GPU process: an exception (a CUDA fault poisons the process's context) becomes a
    `crash` record's fields, and the process ends once it has replied."""
    try:
        return function(*args)
    except Exception as exc:  # noqa: BLE001
        retire_after_reply()
        return {"status": "crash", "reason": f"{type(exc).__name__}: {str(exc)[:400]}"}


class GpuProcess:
    """The Child of one GPU (`device`: its CUDA ordinal, made the only one it sees; None: the one
    the parent's environment gives), started on first use and again after a call that killed it."""

    def __init__(self, device: int | None = None):
        self.device = device
        self.child: Child | None = None

    @property
    def where(self) -> str:
        return "" if self.device is None else f" on GPU {self.device}"

    def _started(self) -> Child:
        if self.child is None or not self.child.alive:
            env = {} if self.device is None else {"CUDA_VISIBLE_DEVICES": str(self.device)}
            self.child = Child(env)
        return self.child

    def call(self, function, args: tuple, timeout: float):
        """function(*args) in the process; ChildDied, ChildTimeout (the process killed) or a
        RuntimeError with the exception's text."""
        child = self._started()
        try:
            return child.call(function, args, timeout)
        except ChildTimeout:
            self.close()
            raise
        except ChildDied:
            self.child = None
            raise

    def run(self, function, args: tuple, timeout: float, doing: str) -> dict:
        """A record's fields from function(*args) in the process, which never raises: what it
        returned; `crash` if it raised (the process then ends: its CUDA context may be poisoned)
        or killed the process; `timeout` if it took longer than `timeout`."""
        try:
            fields = self.call(_guarded, (function, *args), timeout)
            if fields.get("status") == "crash":  # the process retires after this reply: the next call
                self.close()                     # must not reach it before it has gone
            return fields
        except ChildDied as exc:
            return {"status": "crash", "reason": f"the GPU process{self.where} died (exit code {exc.code}) "
                                                 f"during {doing}; the candidate faulted on the GPU"}
        except ChildTimeout:
            return {"status": "timeout", "reason": f"no result within {timeout:.0f} s"}

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child = None
