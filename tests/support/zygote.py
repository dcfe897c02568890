"""A warm fork server ("zygote") for the Python processes the tests start: a launch costs a fork, not an import.

Starting ``python train.py`` on the 2-core CI machine spends 4-10 s importing torch, transformers, accelerate and
easy_context before it does anything; the suite starts a few hundred such processes (launchers and their ranks).
The zygote imports all of that once per session and forks a child per job. :func:`python` is a drop-in for
``sys.executable`` in a test's command line: an executable ("shim") that forwards its argv, environment, working
directory and stdin/stdout/stderr to the zygote, relays signals to the forked child, and exits as the child did
(its exit code, or the signal that ended it). Inside a child ``sys.executable`` is the shim again, so the ranks
that ``accelerate launch`` / torchrun start fork from the zygote too.

The child is the same program as a fresh interpreter would run (``script.py args``, ``-m module args``,
``-c code args``; ``-u``): a new ``__main__``, the child's environment, cwd and ``sys.path[0]``, the random module
re-seeded. What a fork cannot give is handled by falling back to a real interpreter (the shim ``exec``s Python):
options other than ``-u``/``-m``/``-c``, or an environment variable that is read while the preloaded modules import
(``PYTHON*``, ``HF_*``, ``TRANSFORMERS_*``, ``TORCH*`` compile/log settings, ...) that differs from the zygote's,
or a ``PYTHONPATH`` entry with a ``sitecustomize.py`` (it must run before the program's imports).

A fault a test injects into every process of a job (``EC_TEST_PRELUDE``, a Python file: :func:`prelude_env`) is
run by each forked child before its program, as a ``sitecustomize`` runs in a fresh interpreter; the modules are
imported already, so such a file patches attributes (``torch.save``, a class's method), never names a module binds at
import (``from x import f`` took the original).

What differs from a fresh interpreter and stays: the children share the zygote's str-hash seed (fresh interpreters
draw one each, unless PYTHONHASHSEED is set), and warnings the preloaded imports gave were given in the zygote.

Not for tests about process trees (a forked child's parent is the zygote, not the launcher: a launcher killed with
SIGKILL or SIGSTOP does not reach it the way it reaches a real rank; a SIGKILLed shim makes the zygote SIGKILL the
child), nor for tests that look at what an import pulls in (everything is imported already): those keep
``sys.executable``. ``EC_ZYGOTE=0`` turns the zygote off (:func:`python` returns ``sys.executable``).

This module's top level imports only the standard library: the shim imports it with ``python -I -S``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time

PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.run",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "accelerate",
    "accelerate.commands.launch",
    "easy_context.train",
    "easy_context.eval",
)
# Environment variables whose value is read while the preloaded modules import: a child whose value differs from
# the zygote's runs in a fresh interpreter. Prefixes; the exceptions below are read when used (after the fork).
IMPORT_TIME_ENV = ("PYTHON", "HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "LD_", "MKL", "KMP", "GOMP", "EC_",
                   "DS_", "DEEPSPEED", "CUDA", "XDG_", "HOME", "TMPDIR")  # fmt: skip
READ_WHEN_USED = ("PYTHONUNBUFFERED", "PYTHONPATH", "TORCH_EXTENSIONS_DIR", "TORCHELASTIC_", "TORCH_ELASTIC_",
                  "TORCH_NCCL_", "ACCELERATE_", "EC_TEST_", "EC_EXTRAS")  # fmt: skip
CUSTOMIZE = ("sitecustomize", "usercustomize")
PRELUDE = "EC_TEST_PRELUDE"  # a file every forked child runs before its program (a fresh interpreter: sitecustomize)
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
           signal.SIGCONT)  # fmt: skip


def _sensitive(key: str) -> bool:
    return key.startswith(IMPORT_TIME_ENV) and not key.startswith(READ_WHEN_USED)


def _parse(argv: list[str]):
    """``(unbuffered, kind, target, args)`` for the command lines a fork can run, else None."""
    unbuffered, i = False, 0
    while i < len(argv):
        a = argv[i]
        if a == "-u":
            unbuffered, i = True, i + 1
        elif a in ("-m", "-c"):
            if i + 1 >= len(argv):
                return None
            return unbuffered, a, argv[i + 1], argv[i + 2 :]
        elif a.startswith("-m") and len(a) > 2:
            return unbuffered, "-m", a[2:], argv[i + 1 :]
        elif a.startswith("-"):
            return None
        else:
            return unbuffered, "script", a, argv[i + 1 :]
    return None


def _send(sock: socket.socket, obj, fds=()) -> None:
    data = json.dumps(obj).encode()
    msg = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [msg[:4096]], list(fds))
        msg = msg[4096:]
    if msg:
        sock.sendall(msg)


def _recv(sock: socket.socket, with_fds: bool = False):
    fds: list[int] = []
    buf = b""
    if with_fds:
        buf, fds, _flags, _addr = socket.recv_fds(sock, 4096, 3)
    while len(buf) < 4:
        chunk = sock.recv(65536)
        if not chunk:
            return None, fds
        buf += chunk
    (size,) = struct.unpack("!I", buf[:4])
    while len(buf) < 4 + size:
        chunk = sock.recv(max(65536, 4 + size - len(buf)))
        if not chunk:
            return None, fds
        buf += chunk
    return json.loads(buf[4 : 4 + size]), fds


# ---------------------------------------------------------------------------------------------------------- shim
def client_main(sock_path: str, real: str, zygote_pid: int, argv: list[str]) -> None:
    def fallback():
        prelude = os.environ.get(PRELUDE)
        if prelude:  # a fresh interpreter runs it as its sitecustomize (prelude_env named it so)
            path = [os.path.dirname(prelude), *filter(None, [os.environ.get("PYTHONPATH")])]
            os.environ["PYTHONPATH"] = os.pathsep.join(path)
        os.execv(real, [real, *argv])

    parsed = _parse(argv)
    if parsed is None or os.environ.get("EC_ZYGOTE") == "0":
        fallback()
    # The forked child is the zygote's, not our parent's: when our parent dies (a launcher killed), we die, and the
    # zygote then kills the child, as a rank whose launcher is gone ends.
    import ctypes

    parent = os.getppid()
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(70)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + 300
    while True:
        try:
            sock.connect(sock_path)
            break
        except OSError:
            try:
                os.kill(zygote_pid, 0)
            except OSError:
                fallback()  # the zygote is gone
            if time.monotonic() > deadline:
                fallback()
            time.sleep(0.05)  # still importing
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    _send(sock, {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, fds)
    reply, _ = _recv(sock)
    if reply is None or reply.get("fallback"):
        fallback()
    pid = reply["pid"]

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for s in SIGNALS:
        signal.signal(s, forward)
    status = None
    while status is None:
        try:
            status, _ = _recv(sock)
        except InterruptedError:
            continue
        if status is None:  # the zygote died: the child is gone with it
            os._exit(70)
    sys.stdout.flush()
    if status.get("signal"):
        sig = status["signal"]
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)
        os._exit(128 + sig)
    os._exit(status["code"])


# --------------------------------------------------------------------------------------------------------- server
def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001  a module that fails here fails in the child as it would anyway
            print(f"zygote: preloading {name} failed: {exc!r}", file=sys.stderr)
    try:  # DeepSpeed asks py-cpuinfo 4 times per process, a 1 s subprocess each: the machine's answer, asked once
        import cpuinfo

        info = cpuinfo.get_cpu_info()
        cpuinfo.get_cpu_info = lambda: dict(info)
    except Exception as exc:  # noqa: BLE001
        print(f"zygote: py-cpuinfo: {exc!r}", file=sys.stderr)


def _log(env0: dict[str, str], line: str) -> None:
    path = env0.get("EC_ZYGOTE_LOG")  # a file: one line per job, forked or run by a fresh interpreter (and why)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _serve(listener: socket.socket, parent: int, env0: dict[str, str], imported: dict[str, str]):
    """Accept jobs and fork a child for each; returns (in the child only) the job to run. ``env0``: the environment
    the preloaded modules imported under; ``imported``: the same after their import (which sets some variables: torch
    Inductor's cache directory, for one) -- a job may carry either value (its parent imported them too)."""
    by_pid: dict[int, socket.socket] = {}
    while True:
        if os.getppid() != parent:  # pytest is gone: end, and the children with us
            for pid in by_pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            os._exit(0)
        ready, _, _ = select.select([listener, *by_pid.values()], [], [], 0.05)
        for sock in ready:
            if sock is listener:
                conn, _ = listener.accept()
                try:
                    req, fds = _recv(conn, with_fds=True)
                except OSError:
                    conn.close()
                    continue
                if req is None:
                    conn.close()
                    continue
                env = req["env"]
                keys = {k for k in set(env) | set(env0) | set(imported)
                        if _sensitive(k) and env.get(k) not in (env0.get(k), imported.get(k))}  # fmt: skip
                for entry in env.get("PYTHONPATH", "").split(os.pathsep):  # site would import it before anything
                    if entry and any(os.path.exists(os.path.join(entry, f"{m}.py")) for m in CUSTOMIZE):
                        keys.add(f"PYTHONPATH={entry} (sitecustomize)")
                _log(
                    env0,
                    f"{'exec' if keys else 'fork'} {' '.join(req['argv'])[:200]}"
                    + (f" ({sorted(keys)})" if keys else ""),
                )
                if keys:
                    for fd in fds:
                        os.close(fd)
                    _send(conn, {"fallback": sorted(keys)})
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in by_pid.values():
                        other.close()
                    return conn, req, fds
                for fd in fds:
                    os.close(fd)
                _send(conn, {"pid": pid})
                by_pid[pid] = conn
            else:  # the shim ended without its status (SIGKILL): end its child as a real process would end
                pid = next(p for p, c in by_pid.items() if c is sock)
                try:
                    if not sock.recv(1):
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        while by_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = by_pid.pop(pid, None)
            if conn is None:
                continue
            if os.WIFSIGNALED(status):
                reply = {"signal": os.WTERMSIG(status)}
            else:
                reply = {"code": os.waitstatus_to_exitcode(status)}
            try:
                _send(conn, reply)
            except OSError:
                pass
            conn.close()


def _stdio(unbuffered: bool) -> None:
    """The zygote's stdio objects write to fds 0-2, which now are the shim's: set the buffering a fresh interpreter
    would choose (objects that kept a reference to them, such as logging handlers, stay valid)."""
    sys.stdout.reconfigure(line_buffering=unbuffered or os.isatty(1), write_through=unbuffered)
    sys.stderr.reconfigure(line_buffering=True, write_through=unbuffered)


def _run_child(conn: socket.socket, req: dict, fds: list[int], shim: str) -> None:
    import random
    import runpy
    import types

    conn.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    env = req["env"]
    os.environ.clear()
    os.environ.update(env)
    os.chdir(req["cwd"])
    unbuffered, kind, target, args = _parse(req["argv"])
    _stdio(unbuffered or bool(env.get("PYTHONUNBUFFERED")))
    sys.executable = shim
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in extra]
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:  # torch read it in the zygote already
        sys.modules["torch"].set_num_threads(int(threads))
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        prelude = env.get(PRELUDE)
        if prelude:  # what a fresh interpreter would run first, as its sitecustomize
            with open(prelude, "rb") as f:
                exec(compile(f.read(), prelude, "exec"), {"__name__": "sitecustomize", "__file__": prelude})
        if kind == "-m":
            sys.path[:] = [os.getcwd(), *extra, *base]
            sys.argv = ["-m", *args]
            runpy._run_module_as_main(target, alter_argv=True)
        elif kind == "-c":
            sys.path[:] = ["", *extra, *base]
            sys.argv = ["-c", *args]
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.path[:] = [os.path.dirname(os.path.abspath(target)), *extra, *base]
            sys.argv = [target, *args]
            main.__file__ = target
            main.__cached__ = None
            with open(target, "rb") as f:
                code = compile(f.read(), target, "exec")
            exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # as the interpreter reports it: the program's frames only, exit status 1
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        raise SystemExit(1) from None


def server_main(sock_path: str, shim: str) -> None:
    parent = os.getppid()
    env0 = dict(os.environ)
    _preload()
    imported = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    listener.listen(64)
    os.rename(sock_path + ".tmp", sock_path)  # the shims connect once everything is imported
    job = _serve(listener, parent, env0, imported)
    _run_child(*job, shim)  # in a forked child: returns when the program ends; exits as a script would


# --------------------------------------------------------------------------------------------------- for the tests
_STATE: dict = {}


def start(root: str) -> None:
    """Start the session's zygote (in the background: it imports while the first tests run)."""
    import subprocess
    import tempfile

    d = tempfile.mkdtemp(prefix="ec-zygote-")
    sock_path, shim = os.path.join(d, "zygote.sock"), os.path.join(d, "python")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), sock_path, shim], cwd=root,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    with open(shim, "w") as f:
        f.write(f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {here!r})\nimport zygote\n"
                f"zygote.client_main({sock_path!r}, {sys.executable!r}, {proc.pid}, sys.argv[1:])\n")  # fmt: skip
    os.chmod(shim, 0o755)
    _STATE.update(proc=proc, shim=shim, dir=d)


def stop() -> None:
    import shutil

    proc = _STATE.pop("proc", None)
    if proc is not None:
        proc.kill()
        proc.wait()
        shutil.rmtree(_STATE.pop("dir"), ignore_errors=True)
    _STATE.clear()


def forkable_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this process's values of the variables read while the preloaded modules import: a test that
    gives its command a trimmed environment keeps the fork (a child whose values differ from the zygote's runs in a
    fresh interpreter)."""
    return {
        **{k: v for k, v in env.items() if not _sensitive(k)},
        **{k: v for k, v in os.environ.items() if _sensitive(k)},
    }


def prelude_env(hook: str, folder: str) -> dict[str, str]:
    """The environment variables that run ``hook`` (Python source) first in every process of a job: a fork runs it
    as its prelude, a fresh interpreter (``EC_ZYGOTE=0``, or a fallback) as its sitecustomize (``folder`` holds it;
    PYTHONPATH is to be prepended with ``folder``: the key ``PYTHONPATH`` of the result)."""
    path = os.path.join(folder, "sitecustomize.py")
    with open(path, "w") as f:
        f.write(hook)
    if os.environ.get("EC_ZYGOTE") == "0":
        return {"PYTHONPATH": folder}
    return {PRELUDE: path}


def python() -> str:
    """The interpreter for a test's subprocess: the zygote's shim (the zygote starts on the first call), or
    ``sys.executable`` with ``EC_ZYGOTE=0``."""
    if os.environ.get("EC_ZYGOTE") == "0":
        return sys.executable
    proc = _STATE.get("proc")
    if proc is not None and proc.poll() is not None:  # it died: a new one
        stop()
    if not _STATE:
        start(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return _STATE["shim"]


if __name__ == "__main__":
    server_main(sys.argv[1], sys.argv[2])
