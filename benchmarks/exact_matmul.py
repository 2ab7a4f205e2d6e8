"""What exact arithmetic costs, per matrix product, at SmolLM2-135M's shapes: the engine's exact
product in float64 (`exact.linear`: operand rows rounded to a fixed-point grid of `bits_for(K)`
bits, multiplied in float64) against the same exactness from int8 digits (each fixed-point
integer split into signed digits, every digit product accumulated exactly in int32 by
`torch._int_mm`, the shifted partial products combined in int64, converted once) and against
a plain float32 matmul, side by side in one run (methods interleaved, median of `--reps`).

    python benchmarks/exact_matmul.py [--threads 2] [--reps 5] [--tokens 688,1024]

The int8 paths, by digits and base (bits: most bits of a row's largest element they hold):

- x2 base 256, 14 bits; x3 base 256, 22 bits (the float64 path holds 21 at K=576, 20 at 1536);
  both as one `_int_mm` of every digit product (`blocks`), x3 also as one per shift with the
  products of a shift concatenated along K (`shifts`);
- x4 base 128, 26 bits (`shifts`): digits in [-64, 63], the only ones oneDNN's int8 kernels
  without VNNI (AVX2, AVX-512 before VNNI) multiply exactly: they sum pairs of u8 x s8 products
  in saturating int16, which full-range digits overflow;
- x3 products only: the `_int_mm` call of x3 base 256 alone, on digits made beforehand: what
  no split or combination, however fast, could get under.

Each int8 time covers the activation's rounding and digit split, the products, the
combination and the conversion; the weight's digits are made once, as the engine does with its
merged weights. Before timing, every int8 path is checked bit for bit against the float64
path at the float64 path's bits and against the exact integer product (int64) at its own. The
vocabulary projection runs in chunks of rows, as the engine runs it (`model.LOGITS_CHUNK`).
Last, a child process under oneDNN's AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2) says which digit
ranges `_int_mm` multiplies exactly there. Prints each time, its ratio to the float64 path,
and the machine's load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from whitney.local.engine import exact
from whitney.local.engine.model import LOGITS_CHUNK

SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576), (576, 49152)]


@dataclass(frozen=True)
class Digits:
    """Signed digits of a fixed-point integer: `count` of them in base 2**`shift`, each in
    [-2**(shift-1), 2**(shift-1)), holding integers of magnitude up to 2**`bits`."""

    count: int
    shift: int
    bits: int


X2, X3, X4 = Digits(2, 8, 14), Digits(3, 8, 22), Digits(4, 7, 26)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def integers(x: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """x's rows on their fixed-point grid (`exact.fixed_point`) as int32, and each row's step."""
    x = x.detach().float()
    largest = x.abs().amax(-1, keepdim=True)
    top = (largest.view(torch.int32) & exact.EXPONENT_BITS).view(torch.float32) * 2.0
    up = 2.0**bits / top.clamp_(min=2.0**-99)
    return torch.round(x * up).to(torch.int32), 1.0 / up.double()


def split(ints: Tensor, form: Digits) -> Tensor:
    """ints [..., K] (int32) as int8 digits [count, ..., K], lowest first."""
    out = torch.empty((form.count, *ints.shape), dtype=torch.int8)
    half, mask = 1 << (form.shift - 1), (1 << form.shift) - 1
    rest = ints
    for i in range(form.count - 1):
        low = ((rest + half) & mask) - half
        out[i] = low
        rest = torch.bitwise_right_shift(rest - low, form.shift)
    out[form.count - 1] = rest
    return out


def int_weight(w: Tensor, form: Digits, bits: int) -> tuple[Tensor, Tensor]:
    """A weight [N, K] as digits [count, N, K] and its rows' steps [N, 1]."""
    ints, step = integers(w, bits)
    return split(ints, form), step


def blocks(x: Tensor, weight: tuple[Tensor, Tensor], form: Digits, bits: int) -> Tensor:
    """x @ w.T from every digit product in one `_int_mm` ([count*M, K] @ [K, count*N])."""
    wd, wstep = weight
    ints, xstep = integers(x, bits)
    xd, count = split(ints, form), form.count
    m, n = x.shape[0], wd.shape[1]
    c = torch._int_mm(xd.view(count * m, -1), wd.view(count * n, -1).t()).view(count, m, count, n)
    total = torch.zeros(m, n, dtype=torch.int64)
    for s in range(2 * count - 2, -1, -1):
        total <<= form.shift
        for i in range(max(0, s - count + 1), min(s, count - 1) + 1):
            total += c[i, :, s - i]
    return (total.double() * xstep * wstep.t()).float()


def shifts(x: Tensor, weight: tuple[Tensor, Tensor], form: Digits, bits: int) -> Tensor:
    """x @ w.T with one `_int_mm` per shift, the digit products of that shift concatenated
    along K so that each arrives summed."""
    wd, wstep = weight
    ints, xstep = integers(x, bits)
    xd, count = split(ints, form), form.count
    total = torch.zeros(x.shape[0], wd.shape[1], dtype=torch.int64)
    for s in range(2 * count - 2, -1, -1):
        pairs = range(max(0, s - count + 1), min(s, count - 1) + 1)
        a = torch.cat([xd[i] for i in pairs], -1)
        b = torch.cat([wd[s - i] for i in pairs], -1)
        total <<= form.shift
        total += torch._int_mm(a, b.t())
    return (total.double() * xstep * wstep.t()).float()


def chunked(fn: Callable[[Tensor], Tensor], x: Tensor, n: int) -> Tensor:
    """fn over chunks of rows, as the engine runs its vocabulary projection."""
    size = max(1, LOGITS_CHUNK // n) if n > 4096 else x.shape[0]
    return torch.cat([fn(part) for part in x.split(size)])


def check_bits(x: Tensor, w: Tensor) -> None:
    """Every int8 path gives the float64 path's bits at its bits, and at its own bits the exact
    integer dot product (int64 arithmetic) scaled and rounded once."""
    bits = exact.bits_for(x.shape[-1])
    want = exact.linear(x, exact.weight(w))
    for method, form in ((blocks, X3), (shifts, X3), (shifts, X4)):
        if not torch.equal(method(x, int_weight(w, form, bits), form, bits), want):
            raise SystemExit(f"{method.__name__} {form}: not the float64 path's bits")
    for method, form in ((blocks, X2), (blocks, X3), (shifts, X3), (shifts, X4)):
        xi, xs = integers(x, form.bits)
        wi, ws = integers(w, form.bits)
        exact_product = ((xi.long() @ wi.long().t()).double() * xs * ws.t()).float()
        got = method(x, int_weight(w, form, form.bits), form, form.bits)
        if not torch.equal(got, exact_product):
            raise SystemExit(f"{method.__name__} {form}: not the exact product")


AVX2_CHECK = """
import torch
for low, high in ((-128, 128), (-64, 64)):
    a = torch.randint(low, high, (64, 576), dtype=torch.int8)
    b = torch.randint(low, high, (576, 64), dtype=torch.int8)
    same = torch.equal(torch._int_mm(a, b), a.int() @ b.int())
    print(f"  digits in [{low}, {high - 1}]: " + ("exact" if same else "NOT exact"))
"""


def timed_methods(x: Tensor, w: Tensor, n: int) -> dict[str, Callable[[], object]]:
    """The products to time, on x [M, K] and w [N, K], each with its weight prepared."""
    fw = exact.weight(w)
    ws = {form: int_weight(w, form, form.bits) for form in (X2, X3, X4)}
    m, k = x.shape
    a = split(integers(x, X3.bits)[0], X3).view(3 * m, k)
    b = ws[X3][0].view(3 * n, k).t()
    rows = 3 * (max(1, LOGITS_CHUNK // n) if n > 4096 else m)

    def int8(method: Callable[..., Tensor], form: Digits) -> Callable[[], object]:
        return lambda: chunked(lambda p: method(p, ws[form], form, form.bits), x, n)

    return {
        "f32": lambda: chunked(lambda p: p @ w.t(), x, n),
        "f64 exact": lambda: chunked(lambda p: exact.linear(p, fw), x, n),
        "x2/256": int8(blocks, X2),
        "x3/256 blk": int8(blocks, X3),
        "x3/256 sh": int8(shifts, X3),
        "x4/128 sh": int8(shifts, X4),
        "x3 mm only": lambda: [torch._int_mm(p, b) for p in a.split(rows)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", default="688,1024")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} threads, CPU: {cpu_name()}")
    print(f"load average at start: {os.getloadavg()}")
    names = ["f32", "f64 exact", "x2/256", "x3/256 blk", "x3/256 sh", "x4/128 sh", "x3 mm only"]
    print(f"{'M':>5} {'K':>5} {'N':>6} " + " ".join(f"{n:>10}" for n in names) + "  (ms)")
    ratio_lines = []
    for m in (int(t) for t in args.tokens.split(",")):
        for k, n in SHAPES:
            log(f"M={m} K={k} N={n}: checking bits, then timing ...")
            x = torch.randn(m, k, generator=gen)
            x[:, :4] *= 30.0  # outlier channels, as real activations have
            w = torch.randn(n, k, generator=gen) * 0.05
            check_bits(x[:8], w)
            methods = timed_methods(x, w, n)
            times: dict[str, list[float]] = {name: [] for name in methods}
            for fn in methods.values():
                fn()
            for _ in range(args.reps):
                for name, fn in methods.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            med = {name: statistics.median(t) * 1000 for name, t in times.items()}
            print(
                f"{m:>5} {k:>5} {n:>6} " + " ".join(f"{med[n]:>10.1f}" for n in names),
                flush=True,
            )
            ratio_lines.append(
                f"{m:>5} {k:>5} {n:>6} "
                + " ".join(f"{med[n] / med['f64 exact']:>10.2f}" for n in names)
            )
    print("ratios to the float64 exact path:")
    print("\n".join(ratio_lines))
    print(f"load average at end: {os.getloadavg()}")
    print(
        f"bits of a row's largest element: float64 path {exact.bits_for(576)} (K=576), "
        f"{exact.bits_for(1536)} (K=1536); x2/256 {X2.bits}, x3/256 {X3.bits}, x4/128 {X4.bits}"
    )
    print("torch._int_mm under oneDNN's AVX2 kernels (ONEDNN_MAX_CPU_ISA=AVX2, child process):")
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    child = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True)
    print(child.stdout.decode().rstrip() or f"  failed: {child.stderr.decode()[-300:]}")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
