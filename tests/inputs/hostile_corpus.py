"""Generated part of the hostile-input corpus: pickles (no opaque binaries are committed) and the
large files. `generate(directory, marker)` writes every file and returns their names; a payload
that would run code writes `marker` (the tests assert it never appears).

Run it by hand to look at the files: `python tests/inputs/hostile_corpus.py OUT_DIR`.
"""

from __future__ import annotations

import os
import pickle
import random
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

MiB = 2**20
BASE = 0x7F0000000000
HEADER = (
    '{"format": "peakmem-trace", "version": 1, "meta": {}, '
    '"tags": [["parameter", "fc1", "forward", "aten::mm"]]}\n'
)


def entry(action: str, addr: int, size: int, stream: int = 0) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": 0,
            "frames": [{"filename": "train.py", "line": 3, "name": "step"}],
            "pool_id": (0, 0)}


def valid_snapshot() -> dict:
    return {
        "segments": [{"device": 0, "address": BASE, "total_size": 20 * MiB, "stream": 0,
                      "segment_type": "large", "blocks": []}],
        "device_traces": [[
            entry("segment_alloc", BASE, 20 * MiB),
            entry("alloc", BASE, 4 * MiB),
            entry("free_requested", BASE, 4 * MiB),
            entry("free_completed", BASE, 4 * MiB),
        ]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    }


def _snapshot_with(**fields) -> dict:
    snap = valid_snapshot()
    snap["device_traces"][0][1].update(fields)
    return snap


class _Reduce:
    """Pickles as a call of `func(*args)` (the classic code-execution payload)."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _short(opcode: bytes, payload: bytes) -> bytes:
    return b"\x80\x04" + opcode + payload


def pickles(marker: Path) -> dict[str, bytes]:
    """name -> pickle bytes."""
    touch = f"touch {marker}"
    py_touch = f"open({str(marker)!r}, 'w').close()"
    out: dict[str, bytes] = {}
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        out[f"valid_protocol{protocol}.pickle"] = pickle.dumps(valid_snapshot(), protocol)
        out[f"os_system_protocol{protocol}.pickle"] = pickle.dumps(
            _Reduce(os.system, touch), protocol
        )
    out["builtins_eval.pickle"] = pickle.dumps(_Reduce(eval, py_touch))
    out["builtins_exec.pickle"] = pickle.dumps(_Reduce(exec, py_touch))
    out["subprocess_popen.pickle"] = pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(marker)]))
    out["subprocess_call.pickle"] = pickle.dumps(_Reduce(subprocess.call, ["touch", str(marker)]))
    # payload hidden inside an otherwise valid snapshot
    nested = valid_snapshot()
    nested["device_traces"][0][1]["frames"] = [_Reduce(os.system, touch)]
    out["payload_inside_snapshot.pickle"] = pickle.dumps(nested)
    # hand-written opcodes: GLOBAL + REDUCE, INST, STACK_GLOBAL, OBJ, NEWOBJ, EXT1, BINPERSID
    out["opcode_global_reduce.pickle"] = (
        b"cos\nsystem\n(V" + touch.encode() + b"\ntR."
    )
    out["opcode_inst.pickle"] = b"(V" + touch.encode() + b"\nios\nsystem\n."
    out["opcode_stack_global.pickle"] = (
        b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93\x8c" + bytes([len(py_touch)])
        + py_touch.encode() + b"\x85R."
    )
    out["opcode_obj.pickle"] = b"\x80\x02(cos\nsystem\nV" + touch.encode() + b"\no."
    out["opcode_newobj.pickle"] = b"\x80\x02cbuiltins\nobject\n)\x81."
    out["opcode_ext1.pickle"] = b"\x80\x02\x82\x01."
    out["opcode_persid.pickle"] = b"\x80\x02X\x01\x00\x00\x000Q."
    out["opcode_build_setstate.pickle"] = b"\x80\x02}}b."
    # torch tensors: a plain pickle of one, and a torch.save zip archive
    out["torch_tensor.pickle"] = _torch_tensor_pickle()
    out["torch_save.pt"] = _torch_save_zip()
    # huge declared lengths (the file is a few bytes)
    out["huge_binunicode8.pickle"] = _short(b"\x8d", struct.pack("<Q", 2**60) + b"abc")
    out["huge_binbytes8.pickle"] = _short(b"\x8e", struct.pack("<Q", 2**62) + b"abc")
    out["huge_long4.pickle"] = _short(b"\x8b", struct.pack("<i", 2**31 - 1) + b"\x01")
    out["huge_frame.pickle"] = _short(b"\x95", struct.pack("<Q", 2**63) + b"}.")
    out["huge_bytearray8.pickle"] = b"\x80\x05\x96" + struct.pack("<Q", 2**61) + b"x"
    out["next_buffer.pickle"] = b"\x80\x05\x97."
    # truncated, empty, garbage
    whole = pickle.dumps(valid_snapshot())
    out["truncated.pickle"] = whole[: len(whole) // 2]
    out["empty.pickle"] = b""
    out["binary_garbage.pickle"] = random.Random(11).randbytes(4096)
    out["text.pickle"] = "hello snapshot, non-UTF-8: \xff".encode("latin-1")
    # wrong top-level types and fields
    out["top_list.pickle"] = pickle.dumps([1, 2, 3])
    out["top_int.pickle"] = pickle.dumps(12)
    out["top_none.pickle"] = pickle.dumps(None)
    out["top_str.pickle"] = pickle.dumps("device_traces")
    out["no_device_traces.pickle"] = pickle.dumps({"segments": []})
    out["device_traces_dict.pickle"] = pickle.dumps({"device_traces": {"0": []}})
    out["entry_not_dict.pickle"] = pickle.dumps({"device_traces": [[["alloc", 0, 512]]]})
    out["size_nan.pickle"] = pickle.dumps(_snapshot_with(size=float("nan")))
    out["size_inf.pickle"] = pickle.dumps(_snapshot_with(size=float("inf")))
    out["size_float.pickle"] = pickle.dumps(_snapshot_with(size=512.0))
    out["size_str.pickle"] = pickle.dumps(_snapshot_with(size="512"))
    out["size_negative.pickle"] = pickle.dumps(_snapshot_with(size=-512))
    out["size_huge.pickle"] = pickle.dumps(_snapshot_with(size=2**70))
    out["size_bool.pickle"] = pickle.dumps(_snapshot_with(size=True))
    out["size_bytes.pickle"] = pickle.dumps(_snapshot_with(size=b"512"))
    out["addr_tuple.pickle"] = pickle.dumps(_snapshot_with(addr=(1, 2)))
    out["stream_list.pickle"] = pickle.dumps(_snapshot_with(stream=[1]))
    out["action_list.pickle"] = pickle.dumps(_snapshot_with(action=["alloc"]))
    out["action_unknown.pickle"] = pickle.dumps(_snapshot_with(action="teleport"))
    out["action_missing.pickle"] = pickle.dumps(
        {"device_traces": [[{"addr": BASE, "size": 512}]]}
    )
    dup = valid_snapshot()
    dup["device_traces"][0].insert(2, entry("alloc", BASE, 512))
    out["duplicate_address.pickle"] = pickle.dumps(dup)
    out["free_never_allocated.pickle"] = pickle.dumps(
        {"device_traces": [[entry("free_requested", BASE + 4096, 512)]]}
    )
    out["segments_str.pickle"] = pickle.dumps({**valid_snapshot(), "segments": "many"})
    out["segment_size_str.pickle"] = pickle.dumps(
        {**valid_snapshot(), "segments": [{"device": 0, "total_size": "20"}]}
    )
    out["settings_list.pickle"] = pickle.dumps({**valid_snapshot(), "allocator_settings": [1]})
    out["settings_conf_int.pickle"] = pickle.dumps(
        {**valid_snapshot(), "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": 7}}
    )
    out["settings_async_backend.pickle"] = pickle.dumps(
        {**valid_snapshot(),
         "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}}
    )
    out["two_devices.pickle"] = pickle.dumps(
        {"device_traces": [[entry("alloc", BASE, 512)], [entry("alloc", BASE, 512)]]}
    )
    # nesting bombs: deep lists (plain data, top level not a dict) and a deeply nested tuple
    # used as a dict key, whose hash() would overflow the C stack (the child probe refuses it)
    depth = 1_000_000
    out["deep_lists.pickle"] = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    out["deep_tuple_key.pickle"] = (
        b"\x80\x04}" + b"N" + b"\x85" * 2_000_000 + b"Ns."
    )
    return out


def _torch_tensor_pickle() -> bytes:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n)R."
    return pickle.dumps(torch.zeros(2))


def _torch_save_zip() -> bytes:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"device_traces": [[]]}))
    return buffer.getvalue()


def big_files() -> dict[str, bytes]:
    """Large or odd traces and CSVs, too big or too binary to commit."""
    out: dict[str, bytes] = {}
    out["trace_10mb_line.jsonl"] = HEADER.encode() + b"[0,0," + b"1" * (10 * MiB) + b",0,-1]\n"
    out["trace_10mb_header.jsonl"] = b'{"format": "peakmem-trace", "pad": "' + b"x" * (10 * MiB) + b'"'
    out["trace_huge_int.jsonl"] = HEADER.encode() + b"[0,0," + b"9" * 3000 + b",0,-1]\n"
    out["trace_int_5000_digits.jsonl"] = (
        b'{"format": "peakmem-trace", "version": 1, "meta": {"n": ' + b"7" * 5000 + b"}}\n"
    )
    out["trace_deep_header.jsonl"] = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    out["trace_deep_event.jsonl"] = HEADER.encode() + b"[" * 2000 + b"]" * 2000 + b"\n"
    out["trace_non_utf8.jsonl"] = HEADER.encode() + b"[0,0,512,0,-1]\n\xff\xfe\x00garbage\n"
    out["trace_binary_garbage.jsonl"] = random.Random(7).randbytes(8192)
    out["trace_nul_bytes.jsonl"] = b"\x00" * 4096
    out["mlp1_huge_field.csv"] = (
        b"Filename,Max GPU Memory (MiB)\n\"" + b"x" * (300 * 1024) + b"\",1449\n"
    )
    out["mlp1_non_utf8.csv"] = (
        b"Filename,Max GPU Memory (MiB)\ninput:300_output:10_depth:1_arch:pyramid_batch:32"
        b"\xff\xfe.out,1449\n"
    )
    out["mlp1_binary_garbage.csv"] = random.Random(5).randbytes(4096)
    out["mlp1_layer_list_bomb.csv"] = (
        b"Filename,Activations-Params,Max GPU Memory (MiB)\n"
        b"input:300_output:10_depth:1_arch:pyramid_batch:32.out,\"" + b"[" * 50_000 + b"\",1449\n"
    )
    return out


def generate(directory: Path, marker: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {**pickles(marker), **big_files()}
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return sorted(files)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "hostile_out")
    names = generate(target, target / "MARKER")
    print(f"{len(names)} files in {target}")
