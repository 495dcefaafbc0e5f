"""``sagegate study``: the portability study (docs/design/study.md): corpus, calibration, sweep, report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def study(
    out: Annotated[Path, typer.Option(help="Output folder: results, logs, report.md and figures/.")],
    smoke: Annotated[
        bool, typer.Option(help="The CI smoke study: 2 sources × 3 windows × 2 regions × 4 policies.")
    ] = False,
    executor: Annotated[str, typer.Option(help="Where cells run: local (processes) or ray.")] = "local",
    workers: Annotated[
        int | None, typer.Option(help="Local processes (or Ray CPUs when starting Ray); default: all cores.")
    ] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (e.g. auto); default: start Ray locally.")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="Keep finished cells and skip them.")
    ] = True,
    source: Annotated[
        list[str] | None,
        typer.Option(help="Extra source NAME=PATH[,format=FMT][,key=value…]; repeatable."),
    ] = None,
    default_sources: Annotated[
        bool, typer.Option("--default-sources/--no-default-sources", help="Include the four default sources.")
    ] = True,
    windows: Annotated[int | None, typer.Option(help="Windows per source (default 40).")] = None,
    policies: Annotated[
        str | None, typer.Option(help="Comma-separated policies (default: every registered one).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Corpus seed (window choice and noise).")] = None,
    semantic: Annotated[
        bool,
        typer.Option(
            help="Also run the semantic predictor on sources with prompt text, and add the built-in text "
            "source azure-conv-sharegpt (Azure conversation arrivals carrying ShareGPT pairs) unless "
            "--no-default-sources. Embeds every window's prompts once (MiniLM, CPU): opt-in for its cost."
        ),
    ] = False,
    semantic_history: Annotated[
        int | None,
        typer.Option(help="Requests warming the semantic predictor, per text source (default 3000)."),
    ] = None,
    semantic_config: Annotated[
        str | None,
        typer.Option(
            help="The semantic predictor: default, or knn-only (without the ranking head, shipped prior "
            "and spread correction) to measure what they change."
        ),
    ] = None,
    only_sources: Annotated[
        str | None, typer.Option(help="Comma-separated source names to keep (after adding --source ones).")
    ] = None,
    errors: Annotated[
        str | None,
        typer.Option(help="Comma-separated noisy-oracle errors, the first the main one (default 0.2,0.5,1)."),
    ] = None,
    deadline_multiplier: Annotated[
        float | None, typer.Option(help="Deadline = arrival + M × service estimate (default 20).")
    ] = None,
    deadline_sensitivity: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated other multipliers (e.g. 10,40): run the study at the base multiplier and "
            "each of these into OUT/x<M>, and write OUT/deadline_sensitivity.md comparing their rankings."
        ),
    ] = None,
    regions: Annotated[
        str,
        typer.Option(
            help="Region set: violation (LSSP's multiples of each window's knee λ_ref, the default) or "
            "utilisation (U50/U90/U110: offered rate over the reference engine's saturated rate)."
        ),
    ] = "violation",
    report_only: Annotated[
        bool, typer.Option(help="Rewrite the report from the cells already in OUT; simulate nothing.")
    ] = False,
) -> None:
    """Run the portability study: do scheduler rankings survive a change of workload, load and metric?"""
    import json

    from sagegate.study.config import (
        RegionAnchor,
        StudyConfig,
        parse_source,
        smoke_config,
        text_source,
        with_overrides,
        with_utilisation_regions,
    )
    from sagegate.study.config import (
        default_sources as defaults,
    )

    try:
        cfg = smoke_config() if smoke else StudyConfig()
        if RegionAnchor(regions) is RegionAnchor.UTILISATION:
            cfg = with_utilisation_regions(cfg)
        extra = tuple(parse_source(s) for s in source or [])
        if extra or not default_sources:
            base = cfg.sources if default_sources else ()
            if not smoke and default_sources:
                base = defaults()
            cfg = with_overrides(cfg, sources=base + extra)
        if semantic and default_sources and all(s.name != text_source().name for s in cfg.sources):
            cfg = with_overrides(cfg, sources=(*cfg.sources, text_source()))
        if only_sources:
            keep = _names(only_sources)
            missing = [n for n in keep if n not in {s.name for s in cfg.sources}]
            if missing:
                raise ValueError(f"--only-sources: unknown {missing}; have {[s.name for s in cfg.sources]}")
            cfg = with_overrides(cfg, sources=tuple(s for s in cfg.sources if s.name in keep))
        if not cfg.sources:
            raise ValueError("no sources: pass --source or keep the default sources")
        if semantic_config is not None:
            from sagegate.predictor.semantic import NAMED_CONFIGS

            if semantic_config not in NAMED_CONFIGS:
                raise ValueError(f"--semantic-config must be one of {', '.join(NAMED_CONFIGS)}")
        pol = tuple(_names(policies)) if policies else None
        errs = tuple(float(x) for x in _names(errors)) if errors else None
        others = tuple(float(x) for x in _names(deadline_sensitivity)) if deadline_sensitivity else ()
        if any(not x > 0 for x in (*(errs or ()), *others, deadline_multiplier or 1.0)):
            raise ValueError("errors and deadline multipliers must be positive")
        robust = () if errs is not None and len(errs) == 1 else None  # nothing to re-run
        cfg = with_overrides(
            cfg,
            windows=windows,
            policies=pol,
            seed=seed,
            semantic=semantic or None,
            semantic_history=semantic_history,
            semantic_config=semantic_config,
            errors=errs,
            robustness=robust,
            deadline_multiplier=deadline_multiplier,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc

    if report_only:
        _report_only(out)
        return

    from sagegate.study.executors import make_executor
    from sagegate.study.runner import ConfigMismatch, run_study

    try:
        ex = make_executor(executor, workers, ray_address)
    except (ValueError, ImportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if others:
        import shlex
        import sys

        from sagegate.study.sensitivity import run_sensitivity

        argv = sys.argv[sys.argv.index("study") + 1 :] if "study" in sys.argv else []
        command = "sagegate study " + " ".join(shlex.quote(a) for a in argv) if argv else ""
        try:
            path = run_sensitivity(cfg, others, out, ex, resume=resume, command=command)
        except (ConfigMismatch, FileNotFoundError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        finally:
            ex.close()
        typer.echo(json.dumps({"out": str(out), "report": str(path)}))
        return
    try:
        timing = run_study(cfg, out, ex, resume=resume)
    except (ConfigMismatch, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        ex.close()
    typer.echo(json.dumps({"out": str(out), "report": str(out / "report.md"), **timing}))


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _report_only(out: Path) -> None:
    """Rebuild the report from OUT's logs and its own config.json."""
    import json

    from sagegate.study.calibrate import Calibration
    from sagegate.study.config import StudyConfig
    from sagegate.study.report import write_report
    from sagegate.study.sweep import ResultStore

    cfg_path = out / "config.json"
    if not cfg_path.exists():
        typer.echo(f"error: {cfg_path} not found: run the study first", err=True)
        raise typer.Exit(2)
    cfg = StudyConfig.from_dict(json.loads(cfg_path.read_text()))
    cals = [
        Calibration(**json.loads(x))
        for x in (out / "calibration.jsonl").read_text().splitlines()
        if x.strip()
    ]
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    infos_path = out / "sources.json"
    infos = []
    if infos_path.exists():
        from sagegate.study.runner import SourceInfo

        infos = [SourceInfo(**x) for x in json.loads(infos_path.read_text())]
    path = write_report(out, cfg, ResultStore(out / "cells.jsonl").rows(), cals, infos, timing)
    typer.echo(str(path))
