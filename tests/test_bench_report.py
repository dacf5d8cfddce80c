"""The side-by-side benchmark's summaries: min / median / max over repeats, speed-ups taken
within each repeat, and the main job's table (a tiny run, no timing assertions)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from sidebyside import mainjob, torchrec_dlrm
from sidebyside.report import markdown, speedup, summarize


def _record(system: str, repeat: int, ms: float) -> dict:
    return {
        "workload": "W1",
        "system": system,
        "optimizer": "adagrad",
        "label": "Adagrad",
        "median_ms": ms,
        "bytes_per_step": 1e6,
        "state_bytes": 1,
        "peak_rss": 2,
        "rss_before": 1,
        "repeat": repeat,
    }


def _results() -> dict:
    ours = [10.0, 30.0, 20.0]  # a slow second repeat hits both systems
    peer = [20.0, 45.0, 50.0]
    runs = [_record("embcore", r, ms) for r, ms in enumerate(ours)]
    runs += [_record("plain PyTorch", r, ms) for r, ms in enumerate(peer)]
    limits = [
        {"repeat": r, "gather": {"gb_s": 1.0, "rows": 1, "table_rows": 1}, "copy": {}}
        for r in range(3)
    ]
    for lim in limits:
        lim["copy"] = {"gb_s": 1.0, "megabytes": 1}
    return {
        "runs": runs,
        "limits": limits,
        "workloads": {"W1": {"batch": 4096}},
        "options": {"steps": 8, "warmup": 2},
        "skipped": {},
    }


def test_summary_has_min_median_max_and_per_repeat_speedups() -> None:
    rows = {r["system"]: r for r in summarize(_results())}
    ours, peer = rows["embcore"], rows["plain PyTorch"]
    assert (ours["min_ms"], ours["median_ms"], ours["max_ms"]) == (10.0, 20.0, 30.0)
    assert (peer["min_ms"], peer["median_ms"], peer["max_ms"]) == (20.0, 45.0, 50.0)
    # per repeat: 2.0, 1.5, 2.5 -> median 2.0 (the ratio of medians would be 2.25)
    assert speedup(ours, peer) == pytest.approx(2.0)
    table = markdown(_results())
    assert "| W1 | embcore | Adagrad | 10.0 | 20.0 | 30.0 |" in table
    assert "2.00x" in table


def test_mainjob_summary_takes_ratios_within_repeats() -> None:
    results = {
        "options": {"repeats": 3, "steps": 2, "warmup": 1, "batches": 2, "overrides": []},
        "batch_size": 100,
        "threads": 1,
        "step_s": {
            "embcore": [[0.010, 0.012], [0.030, 0.030], [0.020, 0.020]],
            "plain PyTorch": [[0.022, 0.022], [0.036, 0.036], [0.050, 0.050]],
        },
    }
    s = mainjob.summarize(results)
    assert s["systems"]["embcore"]["min"] == pytest.approx(11.0)
    assert s["systems"]["embcore"]["max"] == pytest.approx(30.0)
    assert s["speedups"] == pytest.approx([2.0, 1.2, 2.5])
    assert s["speedup"] == pytest.approx(2.0)
    assert "median 2.00x" in mainjob.markdown(results)


def test_mainjob_runs_both_systems_on_a_tiny_config() -> None:
    options = mainjob.MainJobOptions(
        repeats=2,
        warmup=1,
        steps=2,
        batches=2,
        overrides=["data.batch_size=32", "data.vocab_cap=500", "data.eval_rows=64"],
    )
    results = mainjob.run(options, log=lambda line: None)
    assert set(results["step_s"]) == {"embcore", "plain PyTorch", *_torchrec()}
    assert all(len(r) == 2 and len(r[0]) == 2 for r in results["step_s"].values())
    assert "| plain PyTorch |" in mainjob.markdown(results)


def _torchrec() -> list[str]:
    """The optional TorchRec DLRM system, where torchrec imports."""
    return [] if torchrec_dlrm.unavailable() else [torchrec_dlrm.NAME]


def test_mainjob_says_when_torchrec_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torchrec_dlrm, "unavailable", lambda: "torchrec does not import (here)")
    options = mainjob.MainJobOptions(
        repeats=1,
        warmup=0,
        steps=1,
        batches=1,
        overrides=["data.batch_size=8", "data.vocab_cap=100"],
    )
    lines: list[str] = []
    results = mainjob.run(options, log=lines.append)
    assert list(results["step_s"]) == list(mainjob.EAGER)
    assert "[main job] TorchRec DLRM skipped: torchrec does not import (here)" in lines


def test_mainjob_refuses_an_optimizer_the_peer_cannot_run() -> None:
    options = mainjob.MainJobOptions(
        repeats=1,
        warmup=0,
        steps=1,
        batches=1,
        overrides=["data.batch_size=8", "data.vocab_cap=100", "optim.embedding_optimizer=sgd"],
    )
    with pytest.raises(ValueError, match="plain PyTorch peer runs Adagrad"):
        mainjob.run(options, log=lambda line: None)


def test_dict_output_target_compares_within_each_repeat() -> None:
    from sidebyside.report import targets

    results = _results()
    dict_ms = [10.3, 31.0, 21.0]  # +3%, +3.3%, +5%: within 5% in the median repeat
    results["runs"] += [
        _record("embcore, per-feature output", r, ms) for r, ms in enumerate(dict_ms)
    ]
    checks = {c["target"]: c for c in targets(summarize(results))}
    got = checks["W1: embcore per-feature dict output vs stacked()"]
    assert got["got"] == "+3.3%" and got["met"]
    assert not checks["W1: embcore Adagrad vs plain PyTorch Adagrad"]["met"]  # 2.0x < 3x


def _compiled_results() -> dict:
    ms = {  # per repeat, two steps each (seconds)
        "embcore": [[0.040, 0.040], [0.060, 0.060]],
        "plain PyTorch": [[0.080, 0.080], [0.090, 0.090]],
        "embcore, compiled": [[0.032, 0.032], [0.050, 0.050]],
        "plain PyTorch, compiled": [[0.064, 0.064], [0.060, 0.060]],
    }
    return {
        "options": {"repeats": 2, "steps": 2, "warmup": 1, "batches": 2, "overrides": []},
        "batch_size": 100,
        "threads": 1,
        "default_compile": False,
        "step_s": ms,
        "compile_s": {"embcore, compiled": 41.5, "plain PyTorch, compiled": 30.25},
        "inductor_cache": "cold (a new, empty TORCHINDUCTOR_CACHE_DIR each)",
        "load_average": [1.5, 2.25, 3.0],
    }


def test_mainjob_ratios_of_compiled_and_eager_systems_within_repeats() -> None:
    results = _compiled_results()
    s = mainjob.summarize(results)
    ratios = s["ratios"]
    assert ratios["embcore vs plain PyTorch, both eager"]["runs"] == pytest.approx([2.0, 1.5])
    both = ratios["embcore vs plain PyTorch, both compiled"]["runs"]
    assert both == pytest.approx([2.0, 1.2])
    assert ratios["embcore: compiled vs eager"]["runs"] == pytest.approx([1.25, 1.2])
    plain = ratios["plain PyTorch: compiled vs eager"]["runs"]
    assert plain == pytest.approx([1.25, 1.5])
    assert s["speedup"] == pytest.approx(1.75)  # the default mode here: eager
    table = mainjob.markdown(results)
    assert "| embcore, compiled | 32.0 | 41.0 | 50.0 | 2,439 | 32.0, 50.0 |" in table
    assert "| embcore: compiled vs eager | 1.23x | 1.25x, 1.20x |" in table
    assert "cold (a new, empty TORCHINDUCTOR_CACHE_DIR each)" in table
    assert "embcore, compiled 41.5 s, plain PyTorch, compiled 30.2 s" in table
    assert "load average during the run: 1.5 to 3.0" in table
    assert "default mode (eager; same repeat): median 1.75x" in table


def test_mainjob_target_follows_the_default_mode() -> None:
    results = dict(_compiled_results(), default_compile=True)
    assert mainjob.summarize(results)["speedup"] == pytest.approx(1.6)  # both compiled
    assert "default mode (compiled; same repeat): median 1.60x" in mainjob.markdown(results)


def test_mainjob_section_replaces_only_its_own_section_of_benchmarks_md() -> None:
    results = _compiled_results()
    text = mainjob.section(results, "embcore bench --mainjob --repeats 2")
    assert text.startswith("## Main job\n") and "embcore bench --mainjob --repeats 2" in text
    document = "# BENCHMARKS\n\n## Results\n\nsuite\n\n## Hashing\n\nhash\n"
    once = mainjob.with_section(document, text)
    assert once.index("## Results") < once.index("## Main job") < once.index("## Hashing")
    assert "suite" in once and "hash" in once
    assert mainjob.current_section(once).rstrip("\n") == text.rstrip("\n")
    newer = text.replace("--repeats 2", "--repeats 5")
    twice = mainjob.with_section(once, newer)
    assert twice.count("## Main job") == 1 and "--repeats 5" in twice and "--repeats 2" not in twice
    assert twice.replace(newer.rstrip("\n"), "X") == once.replace(text.rstrip("\n"), "X")
    # the suite's command rewrites the rest of the document and keeps the section
    assert mainjob.with_section(document, mainjob.current_section(twice)) == twice
    assert mainjob.with_section(document, None) == document
    assert mainjob.current_section(document) is None
    assert mainjob.with_section("# BENCHMARKS\n", text).startswith("# BENCHMARKS\n\n## Main job")


def test_mainjob_runs_the_compiled_systems_on_a_tiny_config() -> None:
    options = mainjob.MainJobOptions(
        repeats=2,
        warmup=1,
        steps=2,
        batches=2,
        compile=True,
        overrides=["data.batch_size=32", "data.vocab_cap=500", "data.eval_rows=64"],
    )
    results = mainjob.run(options, log=lambda line: None)
    assert list(results["step_s"]) == [*mainjob.EAGER, *_torchrec(), *mainjob.COMPILED]
    assert all(len(r) == 2 and len(r[0]) == 2 for r in results["step_s"].values())
    assert list(results["compile_s"]) == list(mainjob.COMPILED)
    assert all(s > 0 for s in results["compile_s"].values())
    table = mainjob.markdown(results)
    assert "| plain PyTorch, compiled |" in table
    assert "| plain PyTorch: compiled vs eager |" in table
