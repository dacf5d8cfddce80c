"""GPU mode of the side-by-side benchmark (``embcore bench --device cuda``; BENCHMARKS.md, GPU).

W1 and W2 at batch 65,536 (``W1-gpu``, ``W2-gpu``), and W3 at that batch (``W3-gpu``: W1-gpu's
ids as raw 64-bit keys in dynamic tables), with ``quick`` variants for a smoke run, on one
device, in one process, on the same pre-generated batches, for one optimizer (``adagrad`` or
``rowwise_adagrad``):

* **step**: median ms per training step (forward, loss ``sum((act @ p) ** 2)``, backward,
  optimizer update) of embcore (``EmbeddingEngine``, backend ``auto`` = ``triton`` on CUDA),
  plain PyTorch on the device (``nn.EmbeddingBag(sparse=True)`` + ``optim.Adagrad``, which has
  no row-wise variant: with ``rowwise_adagrad`` it still runs element-wise Adagrad, labelled)
  and FBGEMM TBE on the device (``EmbeddingLocation.DEVICE``, ``exact_adagrad`` or
  ``exact_row_wise_adagrad``) where ``fbgemm_gpu`` imports. Raw keys (W3) have no plain-PyTorch
  or FBGEMM peer: the row shows embcore's fixed-table step on the same Zipf ranks instead;
* **step bandwidth**: the step's bytes of the bandwidth model over the embcore step's time, as
  a fraction of the device-to-device copy bandwidth measured in the same run, beside the
  model's floor at that bandwidth (bytes / copy GB/s);
* **kernels**: embcore's forward lookup and update kernels timed alone (``embcore.ops``), with
  their bytes moved and achieved bandwidth as a fraction of the copy bandwidth.

Bytes moved per step are those of the bandwidth model (:func:`.gpu_model.kernel_bytes`,
tables in their storage dtype, slots of the optimizer): the lookup kernel's for ``lookup``,
the sum of the update's kernels (gains, sort, searchsorted, partial sums and the rule) for
``update``, and all of them plus the non-finite check for the step.

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
    "W3-gpu": dataclasses.replace(
        WORKLOADS["W3"], name="W3-gpu", batch=GPU_BATCH,
        description=WORKLOADS["W3"].description.replace("W1", "W1-gpu"),
    ),
    "W1-gpu-quick": Workload("W1-gpu-quick", (50, 7, 300), 16, 8, 1, 1, description="smoke"),
    "W2-gpu-quick": Workload("W2-gpu-quick", (40, 90), 13, 4, 1, 5, description="smoke"),
    "W3-gpu-quick": Workload("W3-gpu-quick", (50, 7, 300), 16, 8, 1, 1, raw_keys=True,
                             description="smoke"),
}  # fmt: skip

#: each raw-key workload's fixed-table twin (same shape, same Zipf ranks)
FIXED_TWIN = {"W3-gpu": "W1-gpu", "W3-gpu-quick": "W1-gpu-quick"}

OPTIMIZERS = ("adagrad", "rowwise_adagrad")


def _optimizer(name: str) -> ec.Optimizer:
    cls = {"adagrad": ec.Adagrad, "rowwise_adagrad": ec.RowwiseAdagrad}[name]
    return cls(learning_rate=0.01, initial_accumulator_value=0.1)


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
def _embcore_step(
    workload: Workload, batches: list[Batch], device: torch.device, optimizer: str, **engine
):
    tables = [  # raw keys: dynamic tables (no vocabulary size)
        ec.TableConfig(
            vocabulary_size=None if workload.raw_keys else v, dim=workload.dim, name=f"table_{t}"
        )
        for t, v in enumerate(workload.vocab)
    ]
    config = {f"f{t:02d}": ec.FeatureConfig(table=table) for t, table in enumerate(tables)}
    eng = ec.EmbeddingEngine(config, optimizer=_optimizer(optimizer), device=device, **engine)
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


def _fbgemm_step(workload: Workload, batches: list[Batch], device: torch.device, optimizer: str):
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
        optimizer={
            "adagrad": EmbOptimType.EXACT_ADAGRAD,
            "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        }[optimizer],
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
    optimizer: str,
    warmup: int,
    steps: int,
) -> dict[str, dict[str, float]]:
    """Median ms, bytes moved and GB/s of embcore's lookup and update kernels alone."""
    opt = _optimizer(optimizer)
    gen = torch.Generator().manual_seed(0)
    rowwise = optimizer == "rowwise_adagrad"
    states = [
        ops.TableState(
            f"table_{t}",
            (torch.rand(v, workload.dim, generator=gen) * 0.1 - 0.05).to(device, storage_dtype),
            {"accumulators": torch.full((v,) if rowwise else (v, workload.dim), 0.1,
                                        device=device)},
            opt,
        )
        for t, v in enumerate(workload.vocab)
    ]  # fmt: skip
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
    moved = _bytes_moved(workload, batches, storage_dtype, optimizer)
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


def _bytes_moved(
    workload: Workload, batches: list[Batch], storage_dtype: torch.dtype, optimizer: str
) -> dict[str, float]:
    """The bandwidth model's bytes per step: lookup, update, and the whole step."""
    row = workload.dim * torch.finfo(storage_dtype).bits // 8
    slot_row = 4 if optimizer == "rowwise_adagrad" else workload.dim * 4
    ids = float(np.median([b.ids for b in batches]))
    unique = float(np.median([sum(b.unique) for b in batches]))
    bags = workload.tables * workload.batch
    kernels = kernel_bytes(ids, unique, bags, workload.dim, row, slot_row)
    return {
        "lookup": kernels["lookup: forward.pooled"],
        "update": sum(v for k, v in kernels.items() if k.startswith("update:")),
        "step": sum(kernels.values()),
    }


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
    optimizer: str = "adagrad",
    write: Callable[[dict], None] | None = None,
) -> dict:
    """Run the GPU mode; returns a JSON-able dict (see :func:`markdown`). ``write`` is called
    with the results so far after each workload, so a run cut short keeps what it measured."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"GPU benchmark: optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    dev = torch.device(device)
    copy_gb_s = copy_bandwidth(dev, copy_megabytes)
    log(f"device-to-device copy: {copy_gb_s:.1f} GB/s")
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else str(dev),
        "copy_gb_s": copy_gb_s,
        "storage_dtype": str(storage_dtype).removeprefix("torch."),
        "optimizer": optimizer,
        "workloads": {},
    }
    engine = {"backend": backend, "storage_dtype": storage_dtype}
    for name in workloads:
        w = GPU_WORKLOADS[name]
        batches = make_batches(w, warmup + steps)
        entry: dict[str, Any] = {"description": w.description, "batch": w.batch, "steps": {}}
        step, used = _embcore_step(w, batches, dev, optimizer, **engine)
        entry["backend"] = used
        entry["steps"]["embcore"] = _median_ms(step, dev, warmup, steps)
        del step
        if w.raw_keys:  # no peer takes raw 64-bit keys: embcore's fixed tables, same ranks
            twin = GPU_WORKLOADS[FIXED_TWIN[name]]
            twin_step, _ = _embcore_step(twin, make_batches(twin, warmup + steps), dev,
                                         optimizer, **engine)  # fmt: skip
            entry["steps"][f"embcore fixed ({twin.name})"] = _median_ms(
                twin_step, dev, warmup, steps
            )
            del twin_step
            entry["skipped"] = {"plain PyTorch, FBGEMM TBE": "no raw 64-bit keys"}
        else:
            _peers(entry, w, batches, dev, optimizer, warmup, steps, log)
            entry["kernels"] = _kernel_times(
                w, batches, dev, used, storage_dtype, optimizer, warmup, steps
            )
            for k in entry["kernels"].values():
                k["fraction_of_copy"] = k["gb_s"] / copy_gb_s
            step_bytes = _bytes_moved(w, batches, storage_dtype, optimizer)["step"]
            ms = entry["steps"]["embcore"]
            entry["step_bandwidth"] = {
                "bytes": step_bytes,
                "fraction_of_copy": step_bytes / (ms / 1e3) / 1e9 / copy_gb_s,
                "floor_ms_at_copy": step_bytes / (copy_gb_s * 1e9) * 1e3,
            }
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        log(f"{name}: {entry['steps']}")
        results["workloads"][name] = entry
        if write is not None:
            write(results)
    return results


def _peers(entry, w, batches, dev, optimizer, warmup, steps, log) -> None:
    """Plain PyTorch and FBGEMM TBE on the same batches, into ``entry["steps"]``."""
    plain = "plain PyTorch" + (" (Adagrad)" if optimizer != "adagrad" else "")
    entry["steps"][plain] = _median_ms(_plain_torch_step(w, batches, dev), dev, warmup, steps)
    why = _fbgemm_unavailable(dev)
    if why is None:
        entry["steps"]["FBGEMM TBE"] = _median_ms(
            _fbgemm_step(w, batches, dev, optimizer), dev, warmup, steps
        )
    else:
        entry["skipped"] = {"FBGEMM TBE": why}
        log(f"{w.name}: FBGEMM TBE skipped: {why}")


def markdown(results: dict) -> str:
    """The GPU tables: ms/step per system with ratios, and embcore's kernel bandwidth."""
    lines = [
        f"Device: {results['device']}; device-to-device copy {results['copy_gb_s']:.0f} GB/s "
        f"(read + write); embcore tables in {results['storage_dtype']}, optimizer "
        f"{results.get('optimizer', 'adagrad')}.",
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
        "| workload | embcore step: MB moved (model) | floor ms at copy GB/s | measured ms "
        "| fraction of copy |",
        "|---|---|---|---|---|",
    ]
    for name, w in results["workloads"].items():
        if "step_bandwidth" in w:
            b = w["step_bandwidth"]
            lines.append(
                f"| {name} | {b['bytes'] / 1e6:.1f} | {b['floor_ms_at_copy']:.3f} "
                f"| {w['steps']['embcore']:.3f} | {b['fraction_of_copy']:.2f} |"
            )
    lines += [
        "",
        "| workload | embcore kernel | ms | MB moved | GB/s | fraction of copy |",
        "|---|---|---|---|---|---|",
    ]
    for name, w in results["workloads"].items():
        for kernel, k in w.get("kernels", {}).items():
            lines.append(
                f"| {name} | {kernel} ({w['backend']}) | {k['ms']:.3f} | {k['bytes'] / 1e6:.1f} "
                f"| {k['gb_s']:.1f} | {k['fraction_of_copy']:.2f} |"
            )
    return "\n".join(lines) + "\n"
