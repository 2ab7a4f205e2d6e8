"""The exact elementwise work around each product (roundings to fixed point, exact sums of
integers), fused into C++ kernels by torch.compile (Inductor, the machine's C++ compiler).

Every kernel is a plain torch function of exact operations only (scalings by powers of two,
roundings, bit manipulations, sums of integers below 2**53, comparisons): the compiled kernel
gives the bits of the eager function, which runs instead unless `WHITNEY_ENGINE_COMPILE=1`
(off by default: see docs/engine.md), where no compiler is present, until the kernels are
compiled, or after a compiled kernel fails.
Kernels compile once per process in the background (eager meanwhile: the same bits), in a
child process at the lowest priority, then load from the cache it filled (the user's:
`$XDG_CACHE_HOME/whitney-flows/inductor`), each checked bit for bit against its eager
function first, every dimension dynamic so that no shape compiles again."""

from __future__ import annotations

import atexit
import hashlib
import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

log = logging.getLogger("whitney.local.engine")

COMPILE_ENV = "WHITNEY_ENGINE_COMPILE"
Examples = Callable[[], list[tuple]]
COMPILED_FROM = 1 << 16
"""Elements of a kernel's first argument from which it runs compiled; smaller calls (a decode
step's) run eagerly, the same bits: measured on a loaded 2-core machine, interleaved, a
SmolLM2 decode step of 8 rows took 3.6x as long with every call compiled, a 16 x 43 forward
0.81x."""


@dataclass
class Kernel:
    """One fused kernel: the eager function, its compiled form once ready, and example
    arguments to compile it on (`dynamic` the dims of each tensor argument left unspecialised,
    so that sizes 0 and 1 run the same kernel)."""

    eager: Callable[..., object]
    examples: Examples
    dynamic: tuple[tuple[int, ...], ...]
    compiled: Callable[..., object] | None = None

    def __call__(self, *args):
        compiled = self.compiled
        if compiled is None:
            STATE.start()
        if compiled is None or args[0].numel() < COMPILED_FROM:
            return self.eager(*args)
        try:
            with torch.no_grad():  # as compiled: the kernels' inputs are detached
                return compiled(*args)
        except Exception as error:  # noqa: BLE001 - any failure falls back to the same bits
            STATE.fail(f"a compiled kernel failed ({type(error).__name__}: {error})")
            return self.eager(*args)


class State:
    """Whether kernels compile, and the one background compilation of all of them: a child
    process compiles them into the cache (at the lowest priority, so it only takes a core
    nothing else wants), then this process loads them from it (seconds, not a compiler's
    minutes: a process exiting waits for that, and stops the child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kernels: list[Kernel] = []
        self.thread: threading.Thread | None = None
        self.child: subprocess.Popen | None = None
        self.done = threading.Event()
        self.stop = threading.Event()
        self.said = False
        self.seconds = 0.0

    def say(self, message: str) -> None:
        """Log `message` once per process (the first reason kernels run eager; "" says nothing)."""
        if message and not self.said and not self.stop.is_set():
            self.said = True
            log.warning("engine: %s; running eager (the same bits)", message)

    def fail(self, message: str) -> None:
        for kernel in self.kernels:
            kernel.compiled = None
        self.thread = self.thread or threading.current_thread()  # never start again
        self.done.set()
        self.say(message)

    def start(self) -> None:
        """Start compiling every kernel in the background, once per process (unless off)."""
        if self.thread is not None:
            return
        with self.lock:
            if self.thread is not None:
                return
            reason = unavailable()
            if reason is not None:
                self.thread = threading.current_thread()
                self.done.set()
                self.say(reason)
                return
            self.thread = threading.Thread(target=self.compile_all, name="engine-compile")
            self.thread.daemon = True
            self.thread.start()

    def compile_all(self) -> None:
        """The child compiles into the cache, then this process loads the kernels from it."""
        t0 = time.perf_counter()
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread, its child
        if not compiled_marker().exists():
            environment = os.environ | {"TORCHINDUCTOR_CACHE_DIR": inductor_cache()}
            with self.lock:
                if self.stop.is_set():
                    return
                self.child = subprocess.Popen(
                    [sys.executable, "-c", CHILD],
                    env=environment,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            _, errors = self.child.communicate()
            if self.stop.is_set():
                return
            if self.child.returncode != 0:
                last = (errors.strip().splitlines() or ["no message"])[-1]
                self.fail(f"compiling the engine's kernels failed ({last})")
                return
        try:
            compiled = compile_here(self.kernels)
        except Exception as error:  # noqa: BLE001 - no compiled kernels, the same bits
            self.fail(f"loading the engine's kernels failed ({type(error).__name__}: {error})")
            return
        if compiled is None:
            self.fail("a compiled kernel's bits differed from its eager function's")
            return
        for kernel, fn in zip(self.kernels, compiled, strict=True):
            kernel.compiled = fn
        self.seconds = time.perf_counter() - t0
        log.info("engine: %d kernels compiled in %.1f s", len(compiled), self.seconds)
        self.done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Start compiling if not started and wait for it; True if the kernels are compiled."""
        self.start()
        self.done.wait(timeout)
        return all(kernel.compiled is not None for kernel in self.kernels)

    def finish(self) -> None:
        """At exit: stop the compiling child, wait for the kernels being loaded."""
        with self.lock:
            self.stop.set()
            if self.child is not None and self.child.poll() is None:
                self.child.kill()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join()

    def after_fork(self) -> None:
        """A forked child has no compiling thread: it starts its own, if it needs kernels."""
        self.lock = threading.Lock()
        if not self.done.is_set():
            self.thread, self.child, self.done = None, None, threading.Event()


STATE = State()
os.register_at_fork(after_in_child=STATE.after_fork)
atexit.register(STATE.finish)


def unavailable() -> str | None:
    """Why kernels run eager in this process ("" when simply not asked for), or None if they
    compile."""
    setting = os.environ.get(COMPILE_ENV)
    if setting is None:
        return ""  # off by default, said nowhere
    if setting.strip().lower() not in ("1", "true", "yes", "on"):
        return f"compiled kernels off ({COMPILE_ENV}={setting})"
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) for compiled kernels"
    return None


def inductor_cache() -> str:
    """Inductor's cache directory: TORCHINDUCTOR_CACHE_DIR if set, else the user's."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    default = Path(base) / "whitney-flows" / "inductor"
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(default)


def compiled_marker() -> Path:
    """The file the child writes once every kernel of this source and torch is in the cache."""
    import whitney.local.engine.model  # noqa: F401 - registers the model's kernels

    source = [inspect.getsource(k.eager) for k in STATE.kernels] + [inspect.getsource(compile_here)]
    key = hashlib.sha256(json.dumps([torch.__version__, sys.version, source]).encode())
    return Path(inductor_cache()) / f"whitney-kernels-{key.hexdigest()[:16]}"


def main() -> int:
    """The child's work: compile every kernel into the cache, then write the marker."""
    compiled = compile_here(STATE.kernels)
    if compiled is None:
        return 1
    compiled_marker().touch()
    return 0


CHILD = "import sys; from whitney.local.engine import kernels; sys.exit(kernels.main())"


def compile_here(kernels: list[Kernel]) -> list[Callable[..., object]] | None:
    """Every kernel compiled in this process, or None if one's bits on its examples differ
    from its eager function's. After it, a call whose guards fail (an unforeseen shape or
    stride) runs the kernel's function eagerly, never compiling again."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache()
    import torch._inductor.config
    import torch.fx.experimental._config as fx_config

    import whitney.local.engine.model  # noqa: F401 - registers the model's kernels

    torch._inductor.config.compile_threads = 1  # in this thread: no pool of compile processes
    # one thread a kernel: a parallel kernel waits at its end for its slowest thread, which on
    # a busy machine is often descheduled (decode steps ran 2.4x slower than eager with two)
    torch._inductor.config.cpp.threads = 1
    fx_config.use_duck_shape = False  # equal sizes in one call are no reason to recompile
    compiled = []
    for kernel in kernels:
        fn = torch.compile(kernel.eager, dynamic=True, fullgraph=True)
        for args in kernel.examples():
            for mode, inference in inference_patterns(len(args)):
                with torch.inference_mode():  # inference tensors, as sampling and logprobs hold
                    made = [a.clone() if i else a for a, i in zip(args, inference, strict=True)]
                for arg, dims in zip(made, kernel.dynamic, strict=False):
                    for dim in dims:
                        torch._dynamo.decorators.mark_unbacked(arg, dim)
                with torch.inference_mode(mode), torch.no_grad():
                    if not same_bits(fn(*made), kernel.eager(*made)):
                        return None
        compiled.append(fn)
    torch.compiler.set_stance("eager_on_recompile")
    return compiled


def inference_patterns(count: int) -> list[tuple[bool, tuple[bool, ...]]]:
    """The calls a kernel compiles for (its guards tell them apart): whether inference mode is
    on, and which arguments are inference tensors: outside it none; inside it none (weights
    built there), all, or the first alone (data beside cached constants)."""
    none, first = (False,) * count, (True,) + (False,) * (count - 1)
    patterns = [(False, none), (True, none), (True, (True,) * count), (True, first)]
    return list(dict.fromkeys(patterns))


def same_bits(a, b) -> bool:
    if isinstance(a, tuple):
        return all(same_bits(x, y) for x, y in zip(a, b, strict=True))
    return a.dtype == b.dtype and a.shape == b.shape and bool(bits(a).eq(bits(b)).all())


def bits(t: Tensor) -> Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def kernel(examples: Examples, *dynamic: tuple[int, ...]) -> Callable[[Callable], Kernel]:
    """Register a fused kernel: `examples` builds arguments to compile and check it on."""

    def register(fn: Callable) -> Kernel:
        made = Kernel(fn, examples, dynamic)
        STATE.kernels.append(made)
        return made

    return register
