"""Human-readable output of an estimate (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from peakmem.estimate.api import Estimate
from peakmem.inputs import one_line
from peakmem.profiles import Sourced

MIB = 2**20
GIB = 2**30


def human_bytes(size: int) -> str:
    sign = "-" if size < 0 else ""
    size = abs(size)
    if size >= GIB:
        return f"{sign}{size / GIB:,.2f} GiB"
    return f"{sign}{size / MIB:,.1f} MiB"


def short_source(value: Sourced) -> str:
    """Where a profile number came from, in a few words (the profile file has the whole story)."""
    source = value.source.strip()
    if value.assumed:
        return "assumed (--verbose says why)"
    if source.lower().startswith("fitted"):
        return "fitted (calibration split)"
    return source if len(source) <= 40 else source[:37] + "..."


MODULE_NAME_CHARS = 200
"""A module's name in the top-modules table is cut to this many characters."""


def render(result: Estimate, console: Console, verbose: bool = False) -> None:
    kind = "training" if result.estimate_kind == "training" else "forward/inference"
    console.print(
        f"[bold]peakmem estimate[/bold] on [cyan]{result.gpu.device_name}[/cyan] "
        f"({result.gpu.name}, {human_bytes(result.capacity_bytes)}), "
        f"torch {result.torch_version} ({result.stack.name} profile), mode {result.mode}, "
        f"{kind}: {result.steps} training step(s), {result.seconds:.2f} s"
    )
    summary = Table(show_header=False, box=None, pad_edge=False)
    summary.add_column(style="bold")
    summary.add_column(justify="right")
    summary.add_column(style="dim")
    summary.add_row("Peak device memory", human_bytes(result.peak_bytes), "context + libraries + peak reserved (nvidia-smi)"
                    + (" + child processes" if result.processes_bytes else "")
                    + (", the largest GPU's" if result.devices else ""))
    for report in result.devices_json() if result.devices else ():
        # nn.DataParallel over several GPUs: each one's own peak (the rows below are cuda:0's)
        summary.add_row(f"  cuda:{report['device']}", human_bytes(report["peak_bytes"]),
                        "DataParallel: this GPU's own peak")
    summary.add_row("Peak reserved", human_bytes(result.peak_reserved_bytes), "torch.cuda.max_memory_reserved()")
    summary.add_row("Peak allocated", human_bytes(result.peak_allocated_bytes), "torch.cuda.max_memory_allocated()")
    summary.add_row("CUDA context", human_bytes(result.context_bytes), short_source(result.stack.context_for(result.gpu)))
    for family, size in sorted(result.libraries.items()):
        source = short_source(result.stack.library_bytes_for(result.gpu, family))
        summary.add_row(f"{family} (first use)", human_bytes(size), source)
    if result.processes_bytes:
        count = sum(1 for report in result.processes if report["device"])
        summary.add_row("Child processes", human_bytes(result.processes_bytes),
                        f"{count} spawn/forkserver process(es), own contexts (notes)")
    verdict = (
        f"[green]yes[/green], headroom {human_bytes(result.headroom_bytes)}"
        if result.fits
        else f"[red]no[/red], short by {human_bytes(-result.headroom_bytes)}"
    )
    summary.add_row("Fits", verdict, "")
    if result.safety_margin > 0:
        margin_source = short_source(result.stack.safety_margin_for(result.gpu, result.margin_kind))
        reserve = result.margin_reserve_bytes
        label = f"With +{result.safety_margin:.1%} margin" + (
            f" + {human_bytes(reserve)} reserve" if reserve else "")
        summary.add_row(
            label,
            human_bytes(result.peak_bytes_with_margin),
            f"<= 1% of calibration jobs above it; {margin_source}",
        )
    console.print(summary)
    if result.distributed:
        render_ranks(result, console)
    if result.mode_reason:
        console.print(f"mode {result.mode}: {result.mode_reason}", markup=False)
    if result.utilization is not None:
        console.print(f"utilization: {result.utilization.line()}", markup=False)

    total = max(result.breakdown.live_bytes, 1)
    categories = Table(title="Live at the peak, by category", title_justify="left")
    categories.add_column("category")
    categories.add_column("size", justify="right")
    categories.add_column("share", justify="right")
    for name, size in sorted(result.breakdown.by_category.items(), key=lambda item: -item[1]):
        categories.add_row(name, human_bytes(size), f"{100 * size / total:.1f}%")
    console.print(categories)

    _render_modules(result, console)
    for note in result.notes:
        console.print(Text.assemble(("note:", "yellow"), " ", note))  # notes name the job's things
    if verbose:
        for assumption in result.assumptions:
            console.print(f"assumed: {assumption}", style="dim", markup=False)
    else:
        from peakmem.estimate.fallbacks import assumptions_line

        line = assumptions_line(result.assumptions)
        if line:
            console.print(f"assumed: {line}", style="dim", markup=False)


def _render_modules(result: Estimate, console: Console) -> None:
    modules = result.breakdown.top_modules()
    if not modules:
        return
    table = Table(title="Top modules live at the peak", title_justify="left")
    table.add_column("module")
    table.add_column("size", justify="right")
    for name, size in modules:
        # the job's own names: plain text (no rich markup: `[/x]` raised MarkupError), no line
        # breaks, bidi overrides or other controls (they could forge rows)
        table.add_row(Text(one_line(name, MODULE_NAME_CHARS)), human_bytes(size))
    console.print(table)


def render_ranks(result: Estimate, console: Console) -> None:
    """A distributed launch: its shape, and each traced rank's peak (the headline is the
    largest rank's)."""
    info = result.distributed or {}
    console.print(
        f"distributed: {info.get('launcher')}, world size {info.get('world_size')} "
        f"({info.get('nnodes')} node(s) x {info.get('nproc_per_node')}); figures above are rank "
        f"{info.get('largest_rank')}'s",
        markup=False,
    )
    rows = info.get("ranks") or []
    if len(rows) < 2:
        return
    table = Table(title="Per rank", title_justify="left")
    for column in ("rank", "peak", "peak reserved", "peak allocated", "fits"):
        table.add_column(column, justify="right" if column != "fits" else "left")
    for row in rows:
        table.add_row(str(row["rank"]), human_bytes(row["peak_bytes"]),
                      human_bytes(row["peak_reserved_bytes"]),
                      human_bytes(row["peak_allocated_bytes"]), "yes" if row["fits"] else "no")
    console.print(table)
