"""The exact elementwise work around each product (roundings to fixed point, exact sums of
integers), fused into C++ kernels ahead of time (torch.export and AOTInductor, the machine's
C++ compiler).

Every kernel is a plain torch function of exact operations only (scalings by powers of two,
roundings, bit manipulations, sums of integers below 2**53, comparisons): the compiled kernel
gives the bits of the eager function, which runs instead where no compiler is present, with
`WHITNEY_ENGINE_COMPILE=0`, until the kernels are loaded, or after a compiled kernel fails.
A child process compiles them once, at the lowest priority, into the user's cache
(`$XDG_CACHE_HOME/whitney-flows/inductor`); this process only loads the compiled libraries and
checks each bit for bit against its eager function. Nothing here traces in this process:
tracing sets torch's process-wide `torch.compiler.is_compiling()`, which changes what other
torch code running beside it does (torch's AdamW takes its compiled path)."""

from __future__ import annotations

import atexit
import fcntl
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
Shape = tuple[torch.dtype, int, tuple[tuple[int, int], ...]]
"""An argument a compiled kernel takes: its dtype, rank and fixed sizes (dim, size)."""


@dataclass
class Kernel:
    """One fused kernel: the eager function, example arguments to compile and check it on,
    the elements of the first argument from which the eager function is the faster (None:
    never; `benchmarks/engine_kernels.py` measures it), and once loaded the compiled kernel
    (`run`: a list of tensors in, a list out) with the dtype, rank and fixed sizes of each
    argument it was compiled for."""

    eager: Callable[..., object]
    examples: Examples
    eager_from: int | None
    run: Callable[[list[Tensor]], list[Tensor]] | None = None
    shapes: tuple[Shape, ...] = ()

    def __call__(self, *args):
        run = self.run
        if run is None:
            STATE.start()
            return self.eager(*args)
        large = self.eager_from is not None and args[0].numel() >= self.eager_from
        if large or not fits(args, self.shapes):
            return self.eager(*args)
        try:
            out = run(list(args))
        except Exception as error:  # noqa: BLE001 - any failure falls back to the same bits
            STATE.fail(f"a compiled kernel failed ({type(error).__name__}: {error})")
            return self.eager(*args)
        return out[0] if len(out) == 1 else tuple(out)


def fits(args: tuple, shapes: tuple[Shape, ...]) -> bool:
    """Whether `args` are contiguous tensors of the dtypes, ranks and fixed sizes compiled for
    (every call of a kernel asks: dtypes are compared by identity, each shape read once)."""
    for arg, (dtype, rank, fixed) in zip(args, shapes, strict=True):
        if arg.dtype is not dtype or arg.ndim != rank or not arg.is_contiguous():
            return False
        if fixed:
            sizes = arg.shape
            for dim, size in fixed:
                if sizes[dim] != size:
                    return False
    return True


class State:
    """Whether kernels compile, and the one background load of all of them: a child process
    compiles them into the cache if they are not there yet (at the lowest priority, so it only
    takes a core nothing else wants), then this process loads them from it (milliseconds; a
    process exiting stops the child)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kernels: list[Kernel] = []
        self.thread: threading.Thread | None = None
        self.child: subprocess.Popen | None = None
        self.done = threading.Event()
        self.stop = threading.Event()
        self.said = False
        self.seconds = 0.0
        self.nice = 19
        """The compiling child's niceness: the lowest priority, unless compiled on purpose
        (`compile_now`: this process's)."""

    def say(self, message: str) -> None:
        """Log `message` once per process (the first reason kernels run eager)."""
        if not self.said and not self.stop.is_set():
            self.said = True
            log.warning("engine: %s; running eager (the same bits)", message)

    def fail(self, message: str) -> None:
        for kernel in self.kernels:
            kernel.run = None
        self.thread = self.thread or threading.current_thread()  # never start again
        self.done.set()
        self.say(message)

    def start(self) -> None:
        """Start compiling (if not cached) and loading every kernel in the background, once
        per process (unless off)."""
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
        """The child compiles into the cache, then this process loads the kernels from it (at this
        process's priority: loading compiles and runs Inductor's small CPU check, which at the
        lowest priority waited for minutes on a busy machine)."""
        t0 = time.perf_counter()
        directory = compiled_directory()
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / "lock", "w") as lock:  # one compiling child per cache at a time
            while not locked(lock):
                if self.stop.wait(1.0):
                    return
            if not (directory / SHAPES).exists() and not self.compile_in_child():
                return
        try:
            loaded = load(directory, self.kernels)
        except Exception as error:  # noqa: BLE001 - no compiled kernels, the same bits
            self.fail(f"loading the engine's kernels failed ({type(error).__name__}: {error})")
            return
        if loaded is None:
            self.fail("a compiled kernel's bits differed from its eager function's")
            return
        for kernel, (run, shapes) in zip(self.kernels, loaded, strict=True):
            kernel.shapes, kernel.run = shapes, run
        self.load_product(directory)
        self.seconds = time.perf_counter() - t0
        log.info("engine: %d kernels ready in %.1f s", len(loaded), self.seconds)
        self.done.set()

    def load_product(self, directory: Path) -> None:
        """Load the compiled small product (`products`); if it cannot be, say why (once): the
        eager product gives the same bits."""
        from whitney.local.engine import products

        try:
            reason = products.load(directory)
        except Exception as error:  # noqa: BLE001 - the eager product, the same bits
            reason = f"loading the small product failed ({type(error).__name__}: {error})"
        if reason is not None:
            self.say(reason)

    def compile_in_child(self) -> bool:
        """Run the child that fills the cache; False (having said why, or stopping) if none."""
        environment = os.environ | {"TORCHINDUCTOR_CACHE_DIR": inductor_cache()}
        with self.lock:
            if self.stop.is_set():
                return False
            self.child = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(os.getpid()), str(self.nice)],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        _, errors = self.child.communicate()
        if self.stop.is_set():
            return False
        if self.child.returncode != 0:
            last = (errors.strip().splitlines() or ["no message"])[-1]
            self.fail(f"compiling the engine's kernels failed ({last})")
            return False
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Start compiling if not started and wait for it; True if the kernels are loaded."""
        self.start()
        self.done.wait(timeout)
        return all(kernel.run is not None for kernel in self.kernels)

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
SHAPES = "shapes.json"
"""The file the child writes last, once every kernel is compiled: each argument's shape."""


def compile_now() -> bool:
    """Compile the kernels into the user's cache now, by the child an engine run would start, but
    at this process's priority, and load them; True if loaded (False: off, no compiler, or failed,
    having said why)."""
    STATE.nice = os.getpriority(os.PRIO_PROCESS, 0)
    return STATE.wait()


def locked(file) -> bool:
    """Whether this process took the exclusive lock of `file` (never waiting for it)."""
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unavailable() -> str | None:
    """Why kernels run eager in this process, or None if they compile."""
    setting = os.environ.get(COMPILE_ENV, "1")
    if setting.strip().lower() not in ("1", "true", "yes", "on"):
        return f"compiled kernels off ({COMPILE_ENV}={setting})"
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler}) for compiled kernels"
    return None


def inductor_cache() -> str:
    """The kernels' cache directory, the user's (not TORCHINDUCTOR_CACHE_DIR, which importing
    Inductor sets in a process's environment for its children)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "whitney-flows" / "inductor")


def compiled_directory() -> Path:
    """Where the kernels of this source, torch, Python, compiler and CPU are compiled to: the
    source is every module a kernel's code comes from, its helpers in `exact` included."""
    import whitney.local.engine.model  # noqa: F401 - registers the model's kernels
    from whitney.local.engine import exact, products

    modules = {sys.modules[k.eager.__module__] for k in STATE.kernels} | {
        exact,
        products,
        sys.modules[__name__],
    }
    source = sorted(inspect.getsource(module) for module in modules)
    machine = [torch.__version__, sys.version, os.environ.get("CXX", "g++")]
    key = json.dumps([machine, torch.backends.cpu.get_cpu_capability(), source])
    return (
        Path(inductor_cache()) / f"whitney-kernels-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    )


def main() -> int:
    """The child's work: compile every kernel and the small product (`products`) into the
    cache, the kernels' shapes written last."""
    import whitney.local.engine.model  # noqa: F401 - registers the model's kernels
    from whitney.local.engine import products

    directory = compiled_directory()
    directory.mkdir(parents=True, exist_ok=True)
    shapes = [export(kernel, directory / package(n)) for n, kernel in enumerate(STATE.kernels)]
    products.build(directory)  # if it cannot be, it writes why: the kernels stand alone
    written = directory / f"{SHAPES}.{os.getpid()}"
    written.write_text(json.dumps(shapes))
    written.replace(directory / SHAPES)
    return 0


CHILD = """
import ctypes, os, signal, sys
nice = max(int(sys.argv[2]), os.getpriority(os.PRIO_PROCESS, 0))  # never above the parent's
os.setpriority(os.PRIO_PROCESS, 0, nice)  # loading, in the parent, keeps its own
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed if its parent ends first
if os.getppid() != int(sys.argv[1]):  # it ended before that
    sys.exit(1)
from whitney.local.engine import kernels
sys.exit(kernels.main())
"""


def package(n: int) -> str:
    return f"kernel-{n}.pt2"


def export(kernel: Kernel, path: Path) -> list[tuple[str, list[int | None]]]:
    """Compile `kernel` on its first example into the package `path`: every dimension of more
    than one element dynamic (any size, 0 and 1 included), one thread a kernel (a parallel
    kernel waits at its end for its slowest thread, which on a busy machine is often
    descheduled). Returns each argument's dtype and sizes (None: dynamic)."""
    import torch._inductor.config
    import torch.fx.experimental._config as fx_config
    from torch.export import Dim

    configure()
    args = kernel.examples()[0]
    dynamic = tuple({d: Dim.AUTO for d, n in enumerate(a.shape) if n != 1} for a in args)
    with fx_config.patch(backed_size_oblivious=True):  # no guess that a size is not 0 or 1
        program = torch.export.export(Function(kernel.eager), args, dynamic_shapes=(dynamic,))
    made = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix}")  # a package ends in .pt2
    torch._inductor.aoti_compile_and_package(program, package_path=str(made))
    made.replace(path)
    inputs = [node.meta["val"] for node in program.graph.nodes if node.op == "placeholder"]
    return [
        (str(x.dtype).removeprefix("torch."), [n if isinstance(n, int) else None for n in x.shape])
        for x in inputs
    ]


def configure() -> None:
    """Inductor's settings for the kernels, whatever the environment says: no pool of compile
    processes, one thread a kernel, the C++ compiler's floating-point flags pinned to exact
    IEEE arithmetic (no contraction of a * b + c into a fused multiply-add, no unsafe math such as
    x / z turned into x * (1 / z)): both change bits, and Inductor reads them from the user's
    TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG and _UNSAFE_MATH_OPT_FLAG; and the
    target CPU (`march`)."""
    import torch._inductor.config

    torch._inductor.config.compile_threads = 1
    torch._inductor.config.cpp.threads = 1
    torch._inductor.config.cpp.enable_floating_point_contract_flag = "off"
    torch._inductor.config.cpp.enable_unsafe_math_opt_flag = False
    torch._inductor.config.cpp.march = march()


def march() -> str | None:
    """Inductor's -march for the kernels: the machine's own (None: -march=native) if they are
    built for its best vector ISA, else none (""), so that a build for a lower capability (forced
    by ATEN_CPU_CAPABILITY) has that capability's instructions only: -march=native let GCC use
    AVX-512 in an AVX2 build, where it dropped a float64 -> float32 -> float64 round trip."""
    from torch._inductor import cpu_vec_isa

    machine = cpu_vec_isa.valid_vec_isa_list()
    return None if not machine or cpu_vec_isa.pick_vec_isa() == machine[0] else ""


class Function(torch.nn.Module):
    """A kernel's function as the module torch.export takes."""

    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def load(
    directory: Path, kernels: list[Kernel]
) -> list[tuple[Callable[[list[Tensor]], list[Tensor]], tuple[Shape, ...]]] | None:
    """Every kernel's compiled library loaded from `directory` (no tracing), or None if one's
    bits on its examples (inference tensors among them) differ from its eager function's."""
    from torch._inductor import aoti_load_package

    described = json.loads((directory / SHAPES).read_text())
    loaded = []
    for n, (kernel, shapes) in enumerate(zip(kernels, described, strict=True)):
        run = aoti_load_package(str(directory / package(n))).loader.boxed_run
        for args in kernel.examples():
            with torch.inference_mode():
                inference = [a.clone() for a in args]
            for made in (list(args), inference):
                want = kernel.eager(*made)
                got = run(list(made))
                if not same_bits(tuple(got) if isinstance(want, tuple) else got[0], want):
                    return None
        shape = tuple(
            (
                getattr(torch, dtype),
                len(sizes),
                tuple((d, n) for d, n in enumerate(sizes) if n is not None),
            )
            for dtype, sizes in shapes
        )
        loaded.append((run, shape))
    return loaded


def same_bits(a, b) -> bool:
    if isinstance(a, tuple):
        return all(same_bits(x, y) for x, y in zip(a, b, strict=True))
    return a.dtype == b.dtype and a.shape == b.shape and bool(bits(a).eq(bits(b)).all())


def bits(t: Tensor) -> Tensor:
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


def kernel(examples: Examples, eager_from: int | None = None) -> Callable[[Callable], Kernel]:
    """Register a fused kernel: `examples` builds arguments to compile and check it on; calls
    of `eager_from` elements or more run eagerly."""

    def register(fn: Callable) -> Kernel:
        made = Kernel(fn, examples, eager_from)
        STATE.kernels.append(made)
        return made

    return register
