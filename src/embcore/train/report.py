"""What a finished run shows: the summary table and the loss / AUC curves (a PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from embcore.train.config import Config

__all__ = ["plot_curves", "summary_table"]


def summary_table(config: Config, summary: dict[str, Any], out: Path) -> str:
    """A plain-text table of the run's results."""
    final, best = summary["final"], summary["best"]
    rows = [
        ("steps", f"{summary['steps']:,}"),
        ("samples", f"{summary['samples']:,}"),
        ("training time", f"{summary['seconds']:.1f} s (this process)"),
        (
            "throughput",
            f"{summary['samples_per_second']:,.0f} samples/s"
            if summary["samples_per_second"]
            else "no steps run in this process",
        ),
    ]
    if final:
        for key, name in (("auc", "eval AUC"), ("log_loss", "eval log loss")):
            text = f"{final[key]:.4f}"
            if best:
                gap = best[key] - final[key] if key == "auc" else final[key] - best[key]
                text += f"   best reachable {best[key]:.4f}, gap {gap:.4f}"
            rows.append((name, text))
    if "embedding_rows" in summary:
        ids = f", ids: {summary['ids']}" if "ids" in summary else ""
        rows.append(
            (
                "embedding rows",
                f"{summary['embedding_rows']:,} ({config.model.tables} tables{ids})",
            )
        )
    rows.append(("checkpoint", summary["checkpoint"]))
    rows.append(("curves", str(out / "curves.png") if config.train.plot else "off"))
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 2 + max(len(v) for _, v in rows))
    body = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
    return f"{line}\n{body}\n{line}"


def plot_curves(history: dict[str, Any], best: dict[str, float] | None, path: Path) -> None:
    """Training loss and held-out log loss (left), held-out AUC (right), against the step."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    if history["loss"]:
        steps, values = zip(*history["loss"], strict=True)
        left.plot(steps, values, label="train loss", color="tab:blue", alpha=0.8)
    evals = history["eval"]
    if evals:
        steps = [e["step"] for e in evals]
        left.plot(
            steps, [e["log_loss"] for e in evals], "o-", label="eval log loss", color="tab:orange"
        )
        right.plot(steps, [e["auc"] for e in evals], "o-", label="eval AUC", color="tab:green")
    if best:
        left.axhline(best["log_loss"], ls="--", color="gray", label="best reachable")
        right.axhline(best["auc"], ls="--", color="gray", label="best reachable")
    left.set(xlabel="step", ylabel="log loss", title="loss")
    right.set(xlabel="step", ylabel="AUC", title="held-out AUC")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
