"""``python -m moquad.cli ARGS`` (or ``python -c CODE ARGS``) as a real child process, without its ~1-2 s of imports.

:func:`python` is ``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)`` for the tests
that call the CLI many times: a server process started once per test process ("zygote") has imported the CLI and
torch, and forks one child per call. The child is a real process (its own pid, working directory, environment,
file descriptors 0-2), runs the module as ``python -m`` does (``runpy``, as ``__main__``) and exits as an
interpreter does (an uncaught exception's traceback on stderr and status 1, ``SystemExit``, atexit handlers), so
exit codes and everything written to stdout and stderr are those of a fresh process. What differs: the modules the
server imported are already loaded. So a call whose environment differs from the server's in a variable read at
import time (``PYTHON*``, thread counts, kernel settings) runs as a plain subprocess, and tests about what a
command imports, about signals or pipes, or about several processes use ``subprocess`` directly.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# variables read when the server imports torch and the CLI: a call that sets them otherwise runs as a subprocess
_AT_IMPORT = ("PYTHON", "OMP_", "MKL_", "OPENBLAS_", "ONEDNN_", "DNNL_", "ATEN_", "NPY_", "OPENCV_", "TORCH", "CUDA",
              "KMP_", "GOMP_", "LD_", "MOQUAD_IMPORT")
_server: subprocess.Popen | None = None
_lock = threading.Lock()


def _stop() -> None:
    """At exit: end the server (its input closes) and reap it, so its CPU time counts in this process's children."""
    if _server is not None and _server.poll() is None:
        _server.stdin.close()
        try:
            _server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _server.kill()


atexit.register(_stop)


def _key(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_AT_IMPORT)}


def _start() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                            env=dict(os.environ))


def _text(data: bytes) -> str:
    """Bytes as ``subprocess.run(text=True)`` decodes them (locale encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


def python(*argv: object, env: dict[str, str] | None = None, cwd: str | Path | None = None,
           timeout: float | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)``
    for ``argv`` = ``-m moquad.cli ARGS`` or ``-c CODE ARGS``, in a forked child of the server."""
    global _server
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cmd = [sys.executable, *argv]
    if argv[:2] != ["-m", "moquad.cli"] and argv[:1] != ["-c"]:
        raise ValueError("clirun runs `-m moquad.cli ...` or `-c CODE ...`")
    with _lock:
        if _server is None or _server.poll() is not None:
            _server = _start()
            ready = json.loads(_server.stdout.readline() or "{}")
            _server.key = ready.get("key")
        if _server.key != _key(env):  # not the environment the server imported in
            return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            req = {"argv": argv, "env": env, "cwd": str(cwd or os.getcwd()), "out": str(out), "err": str(err)}
            _server.stdin.write((json.dumps(req) + "\n").encode())
            _server.stdin.flush()
            pid = json.loads(_server.stdout.readline())["pid"]
            ready, _, _ = select.select([_server.stdout], [], [], timeout)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                _server.stdout.readline()
                raise subprocess.TimeoutExpired(cmd, timeout, _text(out.read_bytes()), _text(err.read_bytes()))
            rc = json.loads(_server.stdout.readline())["returncode"]
            return subprocess.CompletedProcess(cmd, rc, _text(out.read_bytes()), _text(err.read_bytes()))


def _serve() -> None:
    """The server: import what ``python -m moquad.cli`` and its commands import, then one forked child per request
    line on stdin; replies (the child's pid, then its exit status) on stdout."""
    import torch  # noqa: F401

    import moquad
    import moquad.cli  # noqa: F401

    del sys.modules["moquad.cli"], moquad.cli  # run afresh as __main__ by each child, as `python -m` runs it
    assert threading.active_count() == 1, "the server must not fork with threads"
    requests, replies = sys.stdin.buffer.raw, sys.stdout.buffer
    replies.write((json.dumps({"key": _key(dict(os.environ))}) + "\n").encode())
    replies.flush()
    while line := requests.readline():
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(_child(req))
        replies.write((json.dumps({"pid": pid}) + "\n").encode())
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write((json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())
        replies.flush()


def _child(req: dict) -> int:
    """Become ``python ARGV`` for the request: its directory, environment, stdio and ``sys.argv``; run the module or
    code as the interpreter would and end as it ends (SystemExit's code, an uncaught exception's traceback and
    status 1, then non-daemon threads joined, atexit handlers, stdio flushed). The exit status is returned: the
    caller leaves with ``os._exit``, skipping only the teardown of every module (seconds after a fork: each object
    it frees is a copied page)."""
    import runpy
    import traceback

    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, flags, 0o600)
        os.dup2(f, fd)
        os.close(f)
    argv, code = req["argv"], 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:  # noqa: BLE001 - as the interpreter: the traceback (without this module's frames)
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


if __name__ == "__main__":
    _serve()
