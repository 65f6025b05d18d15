"""A tiny C library that calls Python from native pthreads, as librocketmq calls a listener.

``build_library(directory)`` compiles ``callback_thread.c`` with the machine's ``cc`` into
``directory`` (a temporary one: build outputs never land in the repository) and loads it with
``ctypes.CDLL``, so ``run_callbacks`` runs without the GIL and every callback takes it on a
thread Python did not start, exactly like the classic client's consumer threads.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Callable, List, Tuple

SOURCE = Path(__file__).with_name("callback_thread.c")

#: ``int cb(int index)``: the ctypes type of the callback ``run_callbacks`` calls.
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)

UNSET = -1  # a status slot the C side never wrote


class NativeBuildError(RuntimeError):
    """The C library could not be compiled (no ``cc``, or a compiler error)."""


def build_library(directory: Path) -> ctypes.CDLL:
    """Compile ``callback_thread.c`` into ``directory`` and load it (GIL released in calls)."""
    cc = shutil.which("cc")
    if cc is None:
        raise NativeBuildError(
            "no C compiler: `cc` is not on PATH. The native-callback tests need one to build "
            f"{SOURCE.name} (Debian: apt-get install gcc)"
        )
    output = Path(directory) / "libcallback_thread.so"
    command = [cc, "-shared", "-fPIC", "-pthread", "-O2", "-Wall", "-o", str(output), str(SOURCE)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise NativeBuildError(
            f"`{' '.join(command)}` failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )
    library = ctypes.CDLL(str(output))  # CDLL, not PyDLL: calls release the GIL
    library.run_callbacks.argtypes = [
        CALLBACK,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_int),
    ]
    library.run_callbacks.restype = ctypes.c_int
    return library


def run_callbacks(
    library: ctypes.CDLL, callback: Callable[[int], int], threads: int, calls_per_thread: int
) -> Tuple[int, List[int]]:
    """Have ``threads`` native pthreads call ``callback(index)`` ``calls_per_thread`` times
    each (index = thread * calls_per_thread + call); return what the C side saw: how many
    calls returned 0, and every call's return value by index (``UNSET`` if never written)."""
    total = threads * calls_per_thread
    statuses = (ctypes.c_int * total)(*([UNSET] * total))
    c_callback = CALLBACK(callback)  # referenced until the C function has returned
    successes = library.run_callbacks(c_callback, int(threads), int(calls_per_thread), statuses)
    if successes < 0:
        raise RuntimeError(f"run_callbacks({threads}, {calls_per_thread}) could not start")
    del c_callback
    return int(successes), list(statuses)
