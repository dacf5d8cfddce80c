"""GPU mode of the side-by-side benchmark (``embcore bench --device cuda``; BENCHMARKS.md, GPU).

W1 and W2 at batch 65,536 (``W1-gpu``, ``W2-gpu``; ``quick`` variants for a smoke run), on one
device, in one process, on the same pre-generated batches:

* **step**: median ms per training step (forward, loss ``sum((act @ p) ** 2)``, backward,
  optimizer update) of embcore (``EmbeddingEngine``, backend ``auto`` = ``triton`` on CUDA),
  plain PyTorch on the device (``nn.EmbeddingBag(sparse=True)`` + ``optim.Adagrad``) and
  FBGEMM TBE on the device (``EmbeddingLocation.DEVICE``, ``exact_adagrad``) where
  ``fbgemm_gpu`` imports;
* **kernels**: embcore's forward lookup and update kernels timed alone (``embcore.ops``), with
  their bytes moved and achieved bandwidth as a fraction of the device-to-device copy
  bandwidth measured in the same run.

Bytes moved per step are those of the bandwidth model (:func:`.gpu_model.kernel_bytes`,
tables in their storage dtype): the lookup kernel's for ``lookup``, the sum of the update's
kernels (gains, sort, searchsorted, partial sums and the rule) for ``update``.

Timing waits for the device before and after each step
(``torch.cuda.synchronize``); on the CPU (the interpreter smoke test) it is plain wall time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import embcore as ec
from embcore import ops
from embcore.inputs import FeatureBatch
from sidebyside.gpu_model import kernel_bytes
from sidebyside.workloads import WORKLOADS, Batch, Workload, make_batches, projection

__all__ = ["GPU_WORKLOADS", "copy_bandwidth", "markdown", "run"]

GPU_BATCH = 65_536

GPU_WORKLOADS: dict[str, Workload] = {
    "W1-gpu": dataclasses.replace(
        WORKLOADS["W1"], name="W1-gpu", batch=GPU_BATCH,
        description=WORKLOADS["W1"].description.replace("batch 4096", f"batch {GPU_BATCH}"),
    ),
    "W2-gpu": dataclasses.replace(
        WORKLOADS["W2"], name="W2-gpu", batch=GPU_BATCH,
        description=WORKLOADS["W2"].description.replace("batch 2048", f"batch {GPU_BATCH}"),
    ),
    "W1-gpu-quick": Workload("W1-gpu-quick", (50, 7, 300), 16, 8, 1, 1, description="smoke"),
    "W2-gpu-quick": Workload("W2-gpu-quick", (40, 90), 13, 4, 1, 5, description="smoke"),
}  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[int], Any], device: torch.device, warmup: int, steps: int) -> float:
    """Median wall milliseconds of ``fn(i)`` over ``steps`` calls, after ``warmup``."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(warmup, warmup + steps):
        _sync(device)
        start = time.perf_counter()
        fn(i)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def copy_bandwidth(device: torch.device, megabytes: int, repeats: int = 10) -> float:
    """GB/s of a device-to-device copy of ``megabytes`` (read + write)."""
    n = megabytes * (1 << 20) // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    ms = _median_ms(lambda i: dst.copy_(src), device, 2, repeats)
    return 2 * n * 4 / (ms / 1e3) / 1e9


# ------------------------------------------------------------------------- the systems
def _embcore_step(workload: Workload, batches: list[Batch], device: torch.device, **engine):
    tables = [
        ec.TableConfig(vocabulary_size=v, dim=workload.dim, name=f"table_{t}")
        for t, v in enumerate(workload.vocab)
    ]
    config = {f"f{t:02d}": ec.FeatureConfig(table=table) for t, table in enumerate(tables)}
    opt = ec.Adagrad(learning_rate=0.01, initial_accumulator_value=0.1)
    eng = ec.EmbeddingEngine(config, optimizer=opt, device=device, **engine)
    inputs = [
        {
            f"f{t:02d}": ec.RaggedIds(
                torch.from_numpy(v).to(device), torch.from_numpy(o).to(device)
            )
            for t, (v, o) in enumerate(zip(b.values, b.offsets, strict=True))
        }
        for b in batches
    ]
    p = projection(workload.dim).to(device)

    def step(i: int) -> None:
        acts = eng(inputs[i % len(inputs)])
        sum(((a @ p) ** 2).sum() for a in acts.values()).backward()

    return step, eng.backend


def _plain_torch_step(workload: Workload, batches: list[Batch], device: torch.device):
    torch.sparse.check_sparse_tensor_invariants.disable()
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(v, workload.dim, mode="sum", sparse=True) for v in workload.vocab
    ).to(device)
    opt = torch.optim.Adagrad(bags.parameters(), lr=0.01, initial_accumulator_value=0.1)
    inputs = [
        [
            (torch.from_numpy(v).to(device), torch.from_numpy(o[:-1]).to(device))
            for v, o in zip(b.values, b.offsets, strict=True)
        ]
        for b in batches
    ]
    p = projection(workload.dim).to(device)

    def step(i: int) -> None:
        outs = [bag(v, o) for bag, (v, o) in zip(bags, inputs[i % len(inputs)], strict=True)]
        opt.zero_grad(set_to_none=True)
        sum(((a @ p) ** 2).sum() for a in outs).backward()
        opt.step()

    return step


def _fbgemm_step(workload: Workload, batches: list[Batch], device: torch.device):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    specs = [
        (v, workload.dim, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for v in workload.vocab
    ]
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=specs,
        optimizer=EmbOptimType.EXACT_ADAGRAD,
        learning_rate=0.01,
        eps=1e-8,
        pooling_mode=PoolingMode.SUM,
        device=device,
    )
    inputs = []
    for b in batches:  # the tables' bags back to back: offsets over T * B bags
        values = np.concatenate(b.values)
        starts = np.cumsum([0] + [v.size for v in b.values[:-1]])
        bag_starts = [o[:-1] + s for o, s in zip(b.offsets, starts, strict=True)]
        offsets = np.concatenate([*bag_starts, np.array([values.size])])
        inputs.append((torch.from_numpy(values).to(device), torch.from_numpy(offsets).to(device)))
    p = projection(workload.dim).to(device)

    def step(i: int) -> None:
        values, offsets = inputs[i % len(inputs)]
        out = tbe(values, offsets)  # (B, T * dim); the update runs in backward
        ((out.view(out.shape[0], -1, workload.dim) @ p) ** 2).sum().backward()

    return step


def _fbgemm_unavailable(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "FBGEMM TBE runs on CUDA only"
    try:
        import fbgemm_gpu.split_table_batched_embeddings_ops_training  # noqa: F401
    except Exception as exc:  # ImportError, or an OSError from a build for another torch
        return f"fbgemm_gpu does not import ({type(exc).__name__}: {exc})".splitlines()[0]
    return None


# ------------------------------------------------------------------------- embcore's kernels
def _kernel_times(
    workload: Workload,
    batches: list[Batch],
    device: torch.device,
    backend: str,
    storage_dtype: torch.dtype,
    warmup: int,
    steps: int,
) -> dict[str, dict[str, float]]:
    """Median ms, bytes moved and GB/s of embcore's lookup and update kernels alone."""
    opt = ec.Adagrad(learning_rate=0.01, initial_accumulator_value=0.1)
    gen = torch.Generator().manual_seed(0)
    states = [
        ops.TableState(
            f"table_{t}",
            (torch.rand(v, workload.dim, generator=gen) * 0.1 - 0.05).to(device, storage_dtype),
            {"accumulators": torch.full((v, workload.dim), 0.1, device=device)},
            opt,
        )
        for t, v in enumerate(workload.vocab)
    ]
    feats = [
        [
            [FeatureBatch(torch.from_numpy(v).to(device), torch.from_numpy(o).to(device), None,
                          "sum", (workload.batch,))]
            for v, o in zip(b.values, b.offsets, strict=True)
        ]
        for b in batches
    ]  # fmt: skip
    grads = [[torch.randn(workload.batch, workload.dim, device=device)] for _ in states]
    lrs = [0.01] * len(states)
    row = workload.dim * torch.finfo(storage_dtype).bits // 8
    ids = float(np.median([b.ids for b in batches]))
    unique = float(np.median([sum(b.unique) for b in batches]))
    kernels = kernel_bytes(ids, unique, len(states) * workload.batch, workload.dim, row)
    moved = {
        "lookup": kernels["lookup: forward.pooled"],
        "update": sum(v for k, v in kernels.items() if k.startswith("update:")),
    }
    ms = {
        "lookup": _median_ms(
            lambda i: ops.lookup(backend, states, feats[i % len(feats)]), device, warmup, steps
        ),
        "update": _median_ms(
            lambda i: ops.update(backend, states, feats[i % len(feats)], grads, lrs, i + 1),
            device,
            warmup,
            steps,
        ),
    }
    return {k: {"ms": ms[k], "bytes": moved[k], "gb_s": moved[k] / (ms[k] / 1e3) / 1e9} for k in ms}


# ------------------------------------------------------------------------- the run
def run(
    workloads: list[str],
    device: str = "cuda",
    backend: str = "auto",
    storage_dtype: torch.dtype = torch.float32,
    warmup: int = 2,
    steps: int = 6,
    copy_megabytes: int = 1024,
    log: Callable[[str], None] = print,
) -> dict:
    """Run the GPU mode; returns a JSON-able dict (see :func:`markdown`)."""
    dev = torch.device(device)
    copy_gb_s = copy_bandwidth(dev, copy_megabytes)
    log(f"device-to-device copy: {copy_gb_s:.1f} GB/s")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "copy_gb_s": copy_gb_s,
        "storage_dtype": str(storage_dtype).removeprefix("torch."),
        "workloads": {},
    }
    for name in workloads:
        w = GPU_WORKLOADS[name]
        batches = make_batches(w, warmup + steps)
        entry: dict[str, Any] = {"description": w.description, "batch": w.batch, "steps": {}}
        step, used = _embcore_step(w, batches, dev, backend=backend, storage_dtype=storage_dtype)
        entry["backend"] = used
        entry["steps"]["embcore"] = _median_ms(step, dev, warmup, steps)
        del step
        entry["kernels"] = _kernel_times(w, batches, dev, used, storage_dtype, warmup, steps)
        for k in entry["kernels"].values():
            k["fraction_of_copy"] = k["gb_s"] / copy_gb_s
        entry["steps"]["plain PyTorch"] = _median_ms(
            _plain_torch_step(w, batches, dev), dev, warmup, steps
        )
        why = _fbgemm_unavailable(dev)
        if why is None:
            entry["steps"]["FBGEMM TBE"] = _median_ms(
                _fbgemm_step(w, batches, dev), dev, warmup, steps
            )
        else:
            entry["skipped"] = {"FBGEMM TBE": why}
            log(f"{name}: FBGEMM TBE skipped: {why}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        log(f"{name}: {entry['steps']}")
        results["workloads"][name] = entry
    return results


def markdown(results: dict) -> str:
    """The GPU tables: ms/step per system with ratios, and embcore's kernel bandwidth."""
    lines = [
        f"Device: {results['device']}; device-to-device copy {results['copy_gb_s']:.0f} GB/s "
        f"(read + write); embcore tables in {results['storage_dtype']}.",
        "",
        "| workload | system | ms/step | samples/s | embcore speedup |",
        "|---|---|---|---|---|",
    ]
    for name, w in results["workloads"].items():
        ours = w["steps"]["embcore"]
        for system, ms in w["steps"].items():
            rate = w["batch"] / (ms / 1e3)
            lines.append(f"| {name} | {system} | {ms:.2f} | {rate:,.0f} | {ms / ours:.2f}x |")
        for system, why in w.get("skipped", {}).items():
            lines.append(f"| {name} | {system} | skipped: {why} | | |")
    lines += [
        "",
        "| workload | embcore kernel | ms | MB moved | GB/s | fraction of copy |",
        "|---|---|---|---|---|---|",
    ]
    for name, w in results["workloads"].items():
        for kernel, k in w["kernels"].items():
            lines.append(
                f"| {name} | {kernel} ({w['backend']}) | {k['ms']:.3f} | {k['bytes'] / 1e6:.1f} "
                f"| {k['gb_s']:.1f} | {k['fraction_of_copy']:.2f} |"
            )
    return "\n".join(lines) + "\n"
