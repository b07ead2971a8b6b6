"""Shrink a real memory snapshot into a gzipped JSON digest that a CPU machine can diff against
peakmem's trace: every allocator event (action, address, size, stream) with its innermost
Python frames, and the segments at the end.

    python benchmarks/snapshots/digest.py SNAPSHOT.pickle OUT.json.gz [--frames 6]

The snapshot is read with peakmem's plain-data unpickler (trace/safe_pickle.py: no code runs).
Digest layout: {"segments": [{address, total_size, allocated_size, stream, segment_type,
blocks: [[size, requested_size, state]]}], "events": [[action, addr, size, stream,
"file:line:function" ...]]}; frames in torch's own package are dropped (the job's and the
libraries' frames say which op asked).
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

from peakmem.trace.snapshot import load_snapshot


def frame_text(frame: dict[str, Any]) -> str:
    return f"{frame.get('filename', '?')}:{frame.get('line', 0)}:{frame.get('name', '?')}"


def user_frames(frames: list[dict[str, Any]], keep: int) -> list[str]:
    """The innermost `keep` frames outside torch's own Python package (and no C++ frames)."""
    out = []
    for frame in frames or []:
        name = str(frame.get("filename", ""))
        if "/torch/" in name or not name.endswith(".py"):
            continue
        out.append(frame_text(frame))
        if len(out) == keep:
            break
    return out


def torch_op(frames: list[dict[str, Any]]) -> str:
    """The innermost torch Python frame (names the torch function that asked), if any."""
    for frame in frames or []:
        if "/torch/" in str(frame.get("filename", "")):
            return frame_text(frame).split("/torch/", 1)[1]
    return ""


def digest(snapshot: dict[str, Any], keep: int) -> dict[str, Any]:
    segments = [
        {
            "address": s.get("address"),
            "total_size": s.get("total_size"),
            "allocated_size": s.get("allocated_size"),
            "stream": s.get("stream"),
            "segment_type": s.get("segment_type"),
            "blocks": [[b.get("size"), b.get("requested_size"), b.get("state")]
                       for b in s.get("blocks", [])],
        }
        for s in snapshot.get("segments", [])
    ]
    events = []
    for device_trace in snapshot.get("device_traces", []):
        for e in device_trace:
            frames = e.get("frames", [])
            events.append([e.get("action"), e.get("addr"), e.get("size"), e.get("stream"),
                           torch_op(frames), *user_frames(frames, keep)])
    return {"segments": segments, "events": events}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--frames", type=int, default=6)
    args = parser.parse_args()
    data = digest(load_snapshot(args.snapshot, max_bytes=2**31), args.frames)
    with gzip.open(args.out, "wt") as fh:
        json.dump(data, fh, separators=(",", ":"))
    print(f"{args.out}: {len(data['events'])} events, {len(data['segments'])} segments")


if __name__ == "__main__":
    main()
