"""The main job's training step, eager against ``torch.compile``, in one process.

Two copies of the default DLRM (``embcore train``'s model and data, one PyTorch thread) train
on the same batches; each repeat times ``steps`` steps of one and then of the other (the order
alternates), so both see the same load on a shared machine. A step is what ``embcore train``
times: the engine's input preparation, forward, loss, backward (with the engine's update) and
Adam. Printed: the compile time of the first compiled step, the median per-step time of each
and the compiled/eager ratio taken within each repeat::

    python benchmarks/compiled_step.py                  # 10 repeats of 20 steps
    python benchmarks/compiled_step.py --batch-size 512
    python benchmarks/compiled_step.py --dynamic false --inductor cpp_wrapper=true
    python benchmarks/compiled_step.py --dense-only     # compile the MLPs and interaction only

``--dynamic``, ``--mode`` and ``--inductor KEY=VALUE`` (a ``torch._inductor.config`` setting)
compile with ``torch.compile(model, dynamic=..., mode=...)`` instead of ``embcore train``'s
:func:`embcore.train.loop.compiled`. Set ``TORCHINDUCTOR_CACHE_DIR`` to a new directory for a
cold compile time.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import time

import numpy as np
import torch
import torch.nn.functional as F

from embcore.train.config import Config
from embcore.train.loop import compiled
from embcore.train.model import build_model, embedding_optimizer
from embcore.train.sources import build_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--dynamic", choices=["none", "false", "true"], help="torch.compile's")
    parser.add_argument("--mode", help="torch.compile's mode (default: Inductor's default)")
    parser.add_argument(
        "--inductor", action="append", default=[], metavar="KEY=VALUE", help="Inductor config"
    )
    parser.add_argument(
        "--dense-only", action="store_true", help="compile the bottom MLP, interaction, top MLP"
    )
    args = parser.parse_args()
    for setting in args.inductor:
        key, value = setting.split("=", 1)
        value = {"true": "True", "false": "False"}.get(value, value)
        setattr(_inductor_config(key), key.rsplit(".", 1)[-1], ast.literal_eval(value))
    options = {}
    if args.dynamic is not None:
        options["dynamic"] = {"none": None, "false": False, "true": True}[args.dynamic]
    if args.mode is not None:
        options["mode"] = args.mode

    def compile_model(model: torch.nn.Module) -> torch.nn.Module:
        if args.dense_only:
            for name in ("bottom", "interaction", "top"):
                setattr(model, name, torch.compile(getattr(model, name), **options))
            return model
        return torch.compile(model, **options) if options else compiled(model)

    torch.set_num_threads(1)
    cfg = Config.from_dict({"data": {"batch_size": args.batch_size}})
    source = build_source(cfg.data)
    batches = list(itertools.islice(source.train_batches(0), args.steps * args.repeats + 1))
    systems = {}
    for name in ("eager", "compiled"):
        model = build_model(
            cfg.model, source.vocab_sizes, optimizer=embedding_optimizer(cfg.optim), seed=0
        )
        opt = torch.optim.Adam(model.parameters(), lr=cfg.optim.dense_lr)
        systems[name] = (model, compile_model(model) if name == "compiled" else model, opt)

    def step(name: str, batch) -> None:
        model, forward, opt = systems[name]
        prepared = model.engine.prepare(model.features(batch.sparse))
        loss = F.binary_cross_entropy_with_logits(forward(batch.dense, prepared), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    tick = time.perf_counter()
    step("compiled", batches[0])
    print(f"compile (first compiled step): {time.perf_counter() - tick:.1f} s")
    step("eager", batches[0])
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for r in range(args.repeats):
        chunk = batches[1 + r * args.steps : 1 + (r + 1) * args.steps]
        for name in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
            tick = time.perf_counter()
            for batch in chunk:
                step(name, batch)
            times[name].append((time.perf_counter() - tick) / args.steps)
    eager, comp = np.array(times["eager"]), np.array(times["compiled"])
    print(f"eager    {np.median(eager) * 1e3:7.1f} ms/step")
    print(f"compiled {np.median(comp) * 1e3:7.1f} ms/step")
    print(f"compiled/eager {np.median(comp / eager):.3f} (median of {args.repeats} repeats)")


def _inductor_config(key: str):  # type: ignore[no-untyped-def]
    """The ``torch._inductor.config`` object holding ``key`` (``cpp.threads``: its ``cpp``)."""
    compiled(torch.nn.Identity())  # imports Inductor as embcore train does
    import torch._inductor.config as config

    for part in key.split(".")[:-1]:
        config = getattr(config, part)
    return config


if __name__ == "__main__":
    main()
