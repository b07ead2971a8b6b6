"""Merge the CSVs of sweeps run side by side on one GPU (benchmarks/gpu_parallel_sweep.sh) into a
ground-truth CSV, dropping the rows a neighbour could have changed (peakmem.measure.sweep_merge).

    python benchmarks/merge_parallel_sweep.py --committed benchmarks/groundtruth/h200.csv \\
        --device-log LEASE/device_memory.csv.gz [--device-log ...] --out OUT.csv a.csv c.csv ...

Prints one line per dropped row with its reason, then the counts.
"""

from __future__ import annotations

import csv
from pathlib import Path

import click

from peakmem.measure.groundtruth import ALL_COLUMNS, read_rows
from peakmem.measure.sweep_merge import NOT_COVERED, merge_parallel_rows, read_device_memory


@click.command()
@click.argument("csvs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--committed", required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--device-log", "device_logs", multiple=True, required=True,
              type=click.Path(exists=True, path_type=Path))  # fmt: skip
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--headroom-mib", default=4096, show_default=True,
              help="a device with less free memory than this counts as nearly full")  # fmt: skip
def main(csvs, committed, device_logs, out, headroom_mib) -> None:
    samples = [s for path in device_logs for s in _read(read_device_memory, path)]
    if not samples:
        raise click.ClickException("the device logs hold no samples: cannot check the rows")
    base = _read(read_rows, committed)
    kept, dropped = merge_parallel_rows(
        base, [_read(read_rows, p) for p in csvs], samples, headroom_mib=headroom_mib
    )
    uncovered = [item for item in dropped if NOT_COVERED in item.reason]
    if uncovered and len(uncovered) == len(dropped) and len(kept) == len(base):
        raise click.ClickException(  # every new row: the wrong logs (another lease, a bad clock)
            f"the device logs cover none of the {len(uncovered)} new rows' runs: "
            f"{uncovered[0].reason.split(': ')[0]}")
    for item in dropped:
        click.echo(f"dropped {item.row['job']} {item.row['args']}: {item.reason}")
    try:
        with out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(ALL_COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(kept)
    except OSError as exc:
        raise click.ClickException(f"{out}: cannot write the merged CSV ({exc.strerror})") from None
    configs = len({row.get("config") for row in kept})
    click.echo(f"{len(base)} committed + {len(kept) - len(base)} new rows ({len(dropped)} dropped)"
               f" = {len(kept)} rows over {configs} configurations -> {out}")  # fmt: skip


def _read(reader, path: Path) -> list:
    """`reader(path)`, or one line naming the file where it is not what the merge reads (not a
    ground-truth CSV, binary, an empty file, a field past csv's limit, a gzip bomb): before, a
    traceback."""
    try:
        return reader(path)
    except (OSError, ValueError, csv.Error) as exc:  # UnicodeDecodeError is a ValueError
        text = " ".join(str(exc).split())[:300]
        raise click.ClickException(text if str(path) in text else f"{path}: {text}") from None


if __name__ == "__main__":
    main()
