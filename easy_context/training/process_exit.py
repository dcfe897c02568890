"""End a distributed script without tearing its process groups down: no gloo abort, no teardown deadlock.

Two ways torch's gloo backend (2.13) breaks the end of a finished script, both found here:

* **Abort at finalization.** gloo frees each finished collective on its own worker thread ("pt_gloo_runloop")
  *after* ``wait()`` has returned. Freeing it drops the last reference to a Python tensor, so that thread must take
  the GIL; if the main thread is by then finalizing the interpreter, the worker is force-exited while unwinding a
  C++ destructor: "terminate called without an active exception", SIGABRT, exit -6, after all the work is done
  (pytorch/pytorch#179291). Measured with 2 gloo ranks holding a reference to the world group past
  ``destroy_process_group``, normal exit: 10 aborts in 12 runs; train.py under 2-rank zigzag: 2 in 29.
* **Deadlock in a group's destructor.** A group destroyed while something still holds it (accelerate's
  ``end_training()`` destroys the world group while the DDP model's reducer holds it) is freed later, when that
  holder goes (``main()`` returning): ``~ProcessGroupGloo`` then runs on the main thread *with the GIL held* and
  waits for the work mutex, which a worker thread holds while it frees that same last collective and waits for
  the GIL. Both wait forever, and a Python watchdog thread cannot run either (gdb: main thread in
  ``~ProcessGroupGloo`` <- ``~Reducer`` <- the frame of ``main`` being cleared; ``pt_gloo_runloop`` in
  ``~AsyncAllgatherWork`` -> ``take_gil``). train.py's 2-process test run hung so in 1 of 21 runs (CI: the
  suite hung until its 90-minute limit).

So scripts end with :func:`exit_process`: it runs the ``atexit`` handlers (trackers, logging, temporary files)
while the interpreter is fully alive, flushes the streams and calls ``os._exit``. It destroys no process group:
``os._exit`` runs no destructor, so neither race can happen (the operating system closes the sockets; NCCL's
resources go with the process). Scripts must not destroy the world group themselves before the end either (in
train.py: the trackers are finished, ``accelerator.end_training()`` is not called).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def exit_process(code: int = 0) -> NoReturn:
    """Run the ``atexit`` handlers, flush, and end the process with ``code``; the process groups are left to the
    operating system (see the module doc: destroying them is what aborts or deadlocks).

    Call it last, from a script's ``if __name__ == "__main__":`` block (never from library code or a function
    a test calls in-process). Safe with or without an initialised process group.
    """
    try:
        atexit._run_exitfuncs()  # what a normal exit would run, while the interpreter is fully alive
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed or broken pipe: nothing more can be written anyway
                pass
        os._exit(code)


def run_program(main: Callable[[], object]) -> NoReturn:
    """A script's entry point (console script or ``__main__``): ``main()``, then :func:`exit_process` after the work
    (it skips only the process groups' teardown races), with ``main``'s exit code when it returns an int."""
    code = main()
    exit_process(code if isinstance(code, int) else 0)
