"""``sagegate data ...``: which public data is present (shared, fetched, shipped), and fetching more."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from sagegate.loadgen.fetch import RemoteFile

data_app = typer.Typer(no_args_is_help=True, add_completion=False)

CATALOG_HELP = "A catalogue JSON other than the built-in one (same format as loadgen/fetch_catalog.json)."


@data_app.callback()
def _group() -> None:
    """The public data sets: what is present, and fetching the larger ones from upstream."""


def _count(root: Path, paths: list[str]) -> str:
    n = sum((root / p).exists() for p in paths)
    return f"{n}/{len(paths)}" if n else "-"


@data_app.command("list")
def list_cmd(
    catalog: Annotated[Path | None, typer.Option("--catalog", help=CATALOG_HELP)] = None,
) -> None:
    """Each set with how many of its files are in the shared and fetched folders; what ships; what the
    main job reads."""
    from rich.console import Console
    from rich.table import Table

    from sagegate.loadgen.data import (
        AZURE_CODE,
        AZURE_CONV,
        SHAREGPT,
        SHIPPED,
        SHIPPED_ROOT,
        data_root,
        fetch_root,
        find_data,
    )
    from sagegate.loadgen.fetch import load_catalog

    shared, fetched = data_root(), fetch_root()
    table = Table("set", "files", "shared", "fetched", "licence", "what", box=None)
    for ds in load_catalog(catalog).values():
        paths = [f.path for f in ds.files]
        row = (ds.name, str(len(paths)), _count(shared, paths), _count(fetched, paths), ds.licence, ds.about)
        table.add_row(*row)
    Console(width=160).print(table)
    typer.echo(f"shared:  {shared}{'' if shared.is_dir() else '  (absent)'}")
    typer.echo(f"fetched: {fetched}{'' if fetched.is_dir() else '  (nothing fetched yet)'}")
    shipped = ", ".join("/".join(p) for p in SHIPPED)
    typer.echo(f"shipped: {shipped} (sources and licences: {SHIPPED_ROOT}/DATA.md)")
    typer.echo("the main job reads:")
    for parts in (AZURE_CONV, AZURE_CODE, SHAREGPT):
        found = find_data(*parts)
        typer.echo(f"  {'/'.join(parts)}: {found.describe() if found else 'absent'}")


@data_app.command("fetch")
def fetch_cmd(
    names: Annotated[list[str], typer.Argument(help="Set names, as `sagegate data list` shows them.")],
    dest: Annotated[
        Path | None, typer.Option("--dest", help="Folder to fetch into (default: $SAGEGATE_FETCH_DIR).")
    ] = None,
    catalog: Annotated[Path | None, typer.Option("--catalog", help=CATALOG_HELP)] = None,
) -> None:
    """Download sets from their public upstream into the user data folder: resumable (run it again after
    a cut), each file checked against its pinned sha256 where one is known."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from sagegate.loadgen.data import fetch_root
    from sagegate.loadgen.fetch import OfflineError, load_catalog

    sets = load_catalog(catalog)
    unknown = [n for n in names if n not in sets]
    if unknown:
        raise typer.BadParameter(f"unknown set(s) {unknown}; known: {', '.join(sets)}", param_hint="NAMES")
    root = dest or fetch_root()
    console = Console(stderr=True)
    failed = 0
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    for name in names:
        ds = sets[name]
        console.print(f"[bold]{name}[/]: {ds.about} ({ds.licence}; {ds.source})")
        with Progress(*columns, console=console, transient=True) as bar:
            try:
                for f in ds.files:
                    failed += _fetch_one(f, root, bar, console)
            except OfflineError as exc:
                console.print(f"[red]offline[/]: {exc}", soft_wrap=True)
                console.print(f"(the command: sagegate data fetch {name}{f' --dest {dest}' if dest else ''})")
                raise typer.Exit(1) from None
        if ds.cite:
            console.print(f"  cite: {ds.cite}")
    if failed:
        console.print(f"[red]{failed} file(s) not fetched[/]")
        raise typer.Exit(1)
    typer.echo(f"fetched into {root}")


def _fetch_one(f: RemoteFile, root: Path, bar: Progress, console: Console) -> int:
    """Fetch one file with a progress task; 1 when it failed (the reason printed), else 0."""
    from sagegate.loadgen.fetch import FetchError, OfflineError, fetch_file

    task = bar.add_task(f.path, total=f.size)

    def advance(done: int, total: int | None) -> None:
        bar.update(task, completed=done, total=total)

    try:
        got = fetch_file(f, root, progress=advance)
    except OfflineError:
        raise
    except FetchError as exc:
        console.print(f"  [red]failed[/] {f.path}: {exc}", soft_wrap=True)
        return 1
    finally:
        bar.remove_task(task)
    check = {"sha256": "sha256 ok", "git blob": "git blob id ok"}.get(got.checked, "unpinned")
    console.print(f"  {got.status} {got.path} ({check}; sha256 {got.sha256})", soft_wrap=True)
    return 0
