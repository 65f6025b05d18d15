"""``rocketmq-dedup ops export``: the operator kit shipped in the package."""

from __future__ import annotations

import importlib.resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import (
    Iterator,
    Tuple,
)

import click

from rocketmq_dedup.cli._options import (
    UsageProblem,
)


def kit_files() -> Iterator[Tuple[str, Traversable]]:
    """The operator kit shipped in the package (``rocketmq_dedup/ops``): each file's path in
    the kit (``prometheus/rocketmq-dedup.rules.yml``...) and the file."""

    def walk(folder: Traversable, prefix: str) -> Iterator[Tuple[str, Traversable]]:
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_dir():
                yield from walk(entry, f"{prefix}{entry.name}/")
            elif not entry.name.startswith((".", "__")):
                yield f"{prefix}{entry.name}", entry

    return walk(importlib.resources.files("rocketmq_dedup").joinpath("ops"), "")


@click.group()
def ops() -> None:
    """The operator kit: Prometheus alerting rules, their promtool tests, a Grafana
    dashboard."""


@ops.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
def ops_export(directory: Path, force: bool) -> None:
    """Write the kit's files into DIRECTORY (prometheus/, grafana/), as shipped with this
    version; files that exist are left alone unless --force."""
    files = list(kit_files())
    existing = [name for name, _ in files if (directory / name).exists()]
    if existing and not force:
        raise UsageProblem(
            f"{', '.join(str(directory / n) for n in existing)} exist(s): --force overwrites"
        )
    for name, source in files:
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        click.echo(str(target))
