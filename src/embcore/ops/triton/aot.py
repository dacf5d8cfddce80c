"""Ahead-of-time compilation of every kernel the Triton backend launches (``embcore kernels``).

No GPU is needed: Triton compiles for a :class:`~triton.backends.compiler.GPUTarget` with the
``ptxas`` in its wheel. What is compiled is not a hand-kept list. For each table configuration
of :func:`scenarios` (every optimizer variant, storage dtype, stochastic rounding, input
shape), the backend's own ``lookup``, ``update`` and ``non_finite`` run on small CPU tensors
under :func:`embcore.ops.triton.launch.recording`; every recorded launch is specialised the
way Triton's JIT specialises it at launch (argument types, 16-byte alignment and divisibility,
constexprs, ``num_warps``), de-duplicated, and compiled. A kernel or specialisation the backend
can launch is therefore compiled here as soon as a scenario reaches it.

Per compiled kernel: registers per thread, local memory per thread (where ``ptxas`` spills:
Triton kernels allocate no local arrays), the shared memory the launch requests, warps, and
the widest global load and store in the PTX (``v4`` = 128 bits per thread). Must run without
``TRITON_INTERPRET`` (the interpreter replaces the kernels); ``embcore kernels`` re-runs itself
without it. See docs/gpu_backend.md.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

from embcore import optimizers as opt
from embcore.initializers import slot_values
from embcore.inputs import FeatureBatch
from embcore.ops.state import TableState
from embcore.ops.triton import launch, lookup, non_finite, update

__all__ = ["Compiled", "Scenario", "Spec", "compile_spec", "scenarios", "specs"]

#: one optimizer instance per code path of the rule kernels (constexpr branches)
OPTIMIZERS: dict[str, opt.Optimizer] = {
    "sgd": opt.SGD(learning_rate=0.1),
    "sgd+clip+decay": opt.SGD(
        learning_rate=0.1, clipvalue=0.5, weight_decay_factor=0.1, clip_weight_min=-1.0,
        clip_weight_max=1.0,
    ),
    "adagrad": opt.Adagrad(learning_rate=0.1),
    "rowwise_adagrad": opt.RowwiseAdagrad(learning_rate=0.1),
    "adagrad_momentum": opt.AdagradMomentum(learning_rate=0.1, momentum=0.9),
    "adagrad_momentum_nesterov_pow": opt.AdagradMomentum(
        learning_rate=0.1, momentum=0.5, use_nesterov=True, exponent=3, beta2=0.99
    ),
    "adam": opt.Adam(learning_rate=0.1),
    "adam_dense": opt.Adam(learning_rate=0.1, lazy_adam=False, sum_inside_sqrt=False),
    "ftrl": opt.FTRL(learning_rate=0.1, l1_regularization_strength=0.01),
    "ftrl_multiply_pow": opt.FTRL(
        learning_rate=0.1, learning_rate_power=-0.3, multiply_linear_by_learning_rate=True
    ),
}  # fmt: skip

#: storage dtype and stochastic rounding (only where it changes the kernel: half tables)
STORAGES = [
    (torch.float32, False),
    (torch.float16, False),
    (torch.float16, True),
    (torch.bfloat16, False),
    (torch.bfloat16, True),
]

#: input shapes: (dim, ids per bag, combiner per feature, weighted per feature)
SHAPES: dict[str, tuple[int, int, tuple[str, ...], tuple[bool, ...]]] = {
    "one-hot": (64, 1, ("sum",), (False,)),  # W1; also a sequence feature (bags of 1 id)
    "multi-hot": (128, 20, ("sum",), (False,)),  # W2
    "mean-weighted": (128, 20, ("mean",), (True,)),
    "sqrtn": (64, 8, ("sqrtn",), (False,)),
    "mixed": (64, 8, ("mean", "sum"), (True, False)),  # combiners per bag, weights present
    "widest": (4096, 4, ("sum",), (False,)),  # embcore.ops.triton.MAX_DIM
    "dim-100": (100, 8, ("sum",), (False,)),  # a dim that is not a multiple of 16
}


@dataclass(frozen=True)
class Scenario:
    """One table configuration the backend is driven with."""

    optimizer: str
    dtype: torch.dtype
    stochastic: bool
    shape: str


def scenarios(quick: bool = False) -> list[Scenario]:
    """Every optimizer with every storage on the multi-hot shape, every optimizer in float32
    on the other shapes. ``quick``: the optimizers on one storage mode each (rotating), and
    every shape in float32 with Adagrad."""
    out = []
    for i, name in enumerate(OPTIMIZERS):
        storages = [STORAGES[i % len(STORAGES)]] if quick else STORAGES
        out += [Scenario(name, d, sr, "multi-hot") for d, sr in storages]
        for shape in SHAPES:
            if shape != "multi-hot" and (not quick or name == "adagrad"):
                out.append(Scenario(name, torch.float32, False, shape))
    return out


def _record(s: Scenario) -> list[launch.Launch]:
    """The launches of one lookup, update and gradient check of scenario ``s``."""
    dim, per_bag, combiners, weighted = SHAPES[s.shape]
    optimizer, vocab, bags = OPTIMIZERS[s.optimizer], 64, max(128, 1040 // per_bag)
    gen = torch.Generator().manual_seed(0)
    weight = torch.zeros(vocab, dim, dtype=s.dtype)
    slots = slot_values(optimizer, vocab, dim)
    state = TableState("t", weight, slots, optimizer, s.stochastic)
    feats = []
    for combiner, w in zip(combiners, weighted, strict=True):
        offsets = torch.arange(bags + 1) * per_bag
        values = torch.randint(0, vocab, (bags * per_bag,), generator=gen)
        weights = torch.rand(values.numel(), generator=gen) if w else None
        feats.append(FeatureBatch(values, offsets, weights, combiner, (bags,)))
    grads = [torch.randn(bags, dim, generator=gen) for _ in feats]
    with launch.recording() as launches:
        lookup([state], [feats])
        update([state], [feats], [grads], [0.1], 3)
        non_finite(grads)
    return launches


@dataclass(frozen=True)
class Spec:
    """One kernel specialisation, as Triton's JIT would compile it at launch."""

    name: str  # module.kernel
    label: str  # the constexprs, compactly
    module: str
    attr: str
    signature: dict[str, str]
    constexprs: dict[Any, Any]
    attrs: dict[Any, Any]
    options: dict[str, Any]

    @property
    def key(self) -> tuple:
        return (self.name, repr(self.signature), repr(self.constexprs), repr(self.attrs),
                self.options["num_warps"])  # fmt: skip


_DTYPES = {"*fp32": "f32", "*fp16": "f16", "*bf16": "bf16"}
_POWER = ("sqrt", "rsqrt", "pow", "exp2")


def _label(constexprs: dict[str, Any], signature: dict[str, str], odd_dim: bool, warps: int) -> str:
    """E.g. ``bf16 sr lazy 32x128 w8``: table dtype, flags, tile (ids x dim), warps."""
    parts = [_DTYPES[signature["table"]]] if "table" in signature else []
    parts += ["dim%16!=0"] * odd_dim
    for name, value in constexprs.items():
        if name == "STORAGE":
            continue  # the table's dtype
        if name == "COMBINER":
            parts.append(("sum", "mean", "sqrtn")[value] if value >= 0 else "mixed")
        elif name == "POWER":
            parts.append(_POWER[value])
        elif name == "LAZY":
            parts.append("lazy" if value else "dense")
        elif name in ("BLOCK_D", "BLOCK_L", "SPLIT", "BLOCK"):
            continue
        elif isinstance(value, bool):
            parts += [
                {"STOCHASTIC": "sr", "HAS_WEIGHTS": "weighted"}.get(name, name.lower())
            ] * value
        else:
            parts.append(f"{name.lower()}={value}")
    tile = "x".join(str(constexprs[k]) for k in ("BLOCK_L", "BLOCK_D", "BLOCK") if k in constexprs)
    return " ".join([*parts, tile, f"w{warps}"])


def _spec(record: launch.Launch) -> Spec:
    kernel, kwargs = record.kernel, dict(record.kwargs)
    knobs = triton.knobs  # the options JITFunction.run adds before it specialises
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    backend = make_backend(GPUTarget("cuda", 90, 32))  # specialisation does not depend on cc
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options
    )
    named = {kernel.arg_names[k[0]]: v for k, v in constexprs.items()}
    dim = (kernel.arg_names.index("dim"),) if "dim" in kernel.arg_names else None
    odd_dim = dim is not None and dim in attrs and ["tt.divisibility", 16] not in attrs[dim]
    module = kernel.fn.__module__
    return Spec(
        f"{module.removeprefix('embcore.ops.triton.')}.{kernel.fn.__name__.strip('_')}",
        _label(named, signature, odd_dim, options.num_warps), module, kernel.fn.__name__,
        signature, constexprs, attrs, dict(options.__dict__),
    )  # fmt: skip


def specs(quick: bool = False) -> list[Spec]:
    """Every distinct specialisation the scenarios launch, in first-launch order."""
    if triton.knobs.runtime.interpret:
        raise RuntimeError(
            "embcore.ops.triton.aot: TRITON_INTERPRET is set, so the kernels are interpreted "
            "functions; run without it (embcore kernels does so by itself)"
        )
    seen: dict[tuple, Spec] = {}
    for scenario in scenarios(quick):
        for record in _record(scenario):
            spec = _spec(record)
            seen.setdefault(spec.key, spec)
    return list(seen.values())


@dataclass(frozen=True)
class Compiled:
    """What one compile of a :class:`Spec` for one architecture gave (or its error)."""

    arch: int
    regs: int = 0
    spill_bytes: int = 0
    shared_bytes: int = 0
    warps: int = 0
    load_vector: str = ""
    store_vector: str = ""
    error: str = ""


def _widest(ptx: str, op: str) -> str:
    """The widest ``op.global`` in the PTX: ``v4``, ``v2`` or ``b32``-style scalar."""
    widths = re.findall(rf"\b{op}\.global(?:\.[a-z]+)*?(?:\.(v[248]))?\.[bfsu]\d+", ptx)
    if not widths:
        return "none"
    return max(widths, key=lambda w: int(w[1:]) if w else 1) or "scalar"


def _ptxas_figures(log: str) -> dict[str, int]:
    """Registers and spill bytes from ``ptxas -v``: ``Used N registers``, ``N bytes spill
    stores``, ``N bytes spill loads`` (the largest of each if several functions)."""
    out = {"regs": 0, "spill": 0}
    for regs in re.findall(r"Used (\d+) registers", log):
        out["regs"] = max(out["regs"], int(regs))
    for stores, loads in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log):
        out["spill"] = max(out["spill"], int(stores), int(loads))
    return out


def compile_spec(spec: Spec, arch: int) -> Compiled:
    """Compile ``spec`` for ``sm_<arch>`` (no device needed). ``ptxas`` always runs (Triton's
    cache is bypassed) so that its ``-v`` report, the source of registers and spills, exists."""
    import contextlib
    import importlib
    import io

    kernel = getattr(importlib.import_module(spec.module), spec.attr)
    log = io.StringIO()
    knobs = triton.knobs
    saved = knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log
    knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = True, True
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                ASTSource(kernel, spec.signature, spec.constexprs, spec.attrs),
                target=GPUTarget("cuda", arch, 32),
                options=spec.options,
            )
    except Exception as exc:  # a compile failure is a result to report, not a crash
        return Compiled(arch, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
    finally:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = saved
    figures = _ptxas_figures(log.getvalue())
    ptx = compiled.asm["ptx"]
    return Compiled(
        arch, figures["regs"], figures["spill"], compiled.metadata.shared,
        compiled.metadata.num_warps, _widest(ptx, "ld"), _widest(ptx, "st"),
    )  # fmt: skip


def _serve(conn: Any, log: str) -> None:
    """A compile worker: ``(spec, arch)`` in, :class:`Compiled` out, until ``None``. Its
    stderr goes to ``log`` so that the parent can report an LLVM abort that kills it."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    while (task := conn.recv()) is not None:
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)
        conn.send(compile_spec(*task))


def compile_all(spec_list: list[Spec], archs: list[int], jobs: int) -> Iterator[tuple]:
    """``(spec, Compiled)`` for every spec and architecture in order, compiled by ``jobs``
    worker processes; a compiler crash (an LLVM abort) fails only its own compile."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("fork")
    tasks = [(s, a) for s in spec_list for a in archs]
    results: dict[int, Compiled] = {}
    pending = list(range(len(tasks)))[::-1]
    workers: dict[Any, tuple] = {}  # conn -> (process, task index, log)
    with tempfile.TemporaryDirectory() as tmp:

        def start(i: int, log: str) -> None:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, log), daemon=True)
            proc.start()
            parent.send(tasks[i])
            workers[parent] = (proc, i, log)

        for w in range(min(jobs, len(tasks))):
            start(pending.pop(), os.path.join(tmp, f"worker{w}.log"))
        done = 0
        while workers:
            for conn in wait(list(workers)):
                proc, i, log = workers.pop(conn)
                try:
                    results[i] = conn.recv()
                except EOFError:  # the worker died in the compiler
                    proc.join()
                    with open(log) as f:
                        why = [ln for ln in f.read().splitlines() if "ERROR" in ln] or ["?"]
                    results[i] = Compiled(tasks[i][1], error=f"compiler crashed: {why[0]}")
                    if pending:
                        start(pending.pop(), log)
                    continue
                if pending:
                    conn.send(tasks[pending[-1]])
                    workers[conn] = (proc, pending.pop(), log)
                else:
                    conn.send(None)
                    proc.join()
            while done in results:
                yield tasks[done][0], results.pop(done)
                done += 1
