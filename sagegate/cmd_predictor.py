"""``sagegate predictor ...``: the semantic output-length predictor's offline evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

predictor_app = typer.Typer(no_args_is_help=True, add_completion=False)


@predictor_app.callback()
def _group() -> None:
    """The semantic output-length predictor."""


SHAREGPT = "../shared/data/sharegpt/sharegpt_v3_first_turn_pairs.jsonl.gz"
DATA_HELP = "JSONL(.gz) of {prompt, output_tokens[, prompt_tokens, arrival_s]}, or the ShareGPT pairs."


@predictor_app.command("eval")
def eval_cmd(
    data: Annotated[
        Path,
        typer.Option("--data", help="JSONL(.gz) of {prompt, output_tokens[, prompt_tokens, arrival_s]}."),
    ] = Path(SHAREGPT),
    history: Annotated[
        int, typer.Option("--history", help="Leading items used as warm history only.")
    ] = 6000,
    limit: Annotated[int | None, typer.Option("--limit", help="Read at most this many items.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    quantize: Annotated[
        bool | None,
        typer.Option("--quantize/--no-quantize", help="int8 linear layers (default: the embedder's)."),
    ] = None,
    window: Annotated[
        int | None, typer.Option("--window", help="Word pieces the model reads: 64, 96, 128 or 256.")
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Do not read or write cached embeddings.")
    ] = False,
    k: Annotated[int | None, typer.Option("--k", help="Neighbours kept (default: tuned).")] = None,
    dense_weight: Annotated[
        float | None, typer.Option("--dense-weight", help="Weight of the embedding cosine in the blend.")
    ] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", help="Similarity sharpening.")] = None,
    prior_weight: Annotated[
        float | None, typer.Option("--prior-weight", help="Shrinkage pseudo-count toward the prior.")
    ] = None,
    probe_weight: Annotated[
        float | None, typer.Option("--probe-weight", help="Pull toward the linear probe (0: pure kNN).")
    ] = None,
) -> None:
    """Online time-ordered replay: predict each request from those before it, then add it."""
    import json
    from dataclasses import replace

    from predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW, WINDOWS, MiniLMEmbedder
    from predictor.evaluate import evaluate, format_report, load_items
    from predictor.semantic import SemanticConfig

    if window is not None and window not in WINDOWS:
        raise typer.BadParameter(f"choose one of {sorted(WINDOWS)}", param_hint="--window")
    if not data.exists():
        raise typer.BadParameter(f"{data} does not exist", param_hint="--data")
    items = load_items(data, limit)
    if history >= len(items):
        raise typer.BadParameter(f"--history {history} leaves nothing to score ({len(items)} items)")
    config = SemanticConfig()
    if k is not None:
        config = replace(config, k=k)
    if dense_weight is not None:
        config = replace(config, dense_weight=dense_weight)
    if temperature is not None:
        config = replace(config, temperature=temperature)
    if prior_weight is not None:
        config = replace(config, prior_weight=prior_weight)
    if probe_weight is not None:
        config = replace(config, probe_weight=probe_weight)
    embedder = MiniLMEmbedder(
        quantize=DEFAULT_QUANTIZE if quantize is None else quantize,
        window=DEFAULT_WINDOW if window is None else window,
    )
    report = evaluate(items, history, embedder, config, use_cache=not no_cache)
    report["embed_version"] = embedder.version
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(format_report(report))
