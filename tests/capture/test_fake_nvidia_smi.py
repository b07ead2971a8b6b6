"""The job's `nvidia-smi` answers for the target GPU (capture/fake_nvidia_smi.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from peakmem.capture import fake_nvidia_smi

SRC = Path(__file__).resolve().parents[2] / "src"
A100 = "NVIDIA A100-SXM4-40GB"


def test_query_gpu_csv_with_and_without_header_and_units():
    code, text = fake_nvidia_smi.main(
        ["--query-gpu=index,name,memory.total,memory.used,memory.free", "--format=csv"],
        A100, 40536, count=2,
    )
    assert code == 0
    assert text.splitlines() == [
        "index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB]",
        f"0, {A100}, 40536 MiB, 0 MiB, 40536 MiB",
        f"1, {A100}, 40536 MiB, 0 MiB, 40536 MiB",
    ]
    code, text = fake_nvidia_smi.main(
        ["--query-gpu", "memory.free,count", "--format", "csv,noheader,nounits", "-i", "1"],
        A100, 40536, count=2,
    )
    assert (code, text) == (0, "40536, 2\n")


def test_unknown_fields_list_and_memory_details():
    code, text = fake_nvidia_smi.main(["--query-gpu=bogus", "--format=csv"], A100, 100)
    assert code == 2 and "bogus" in text
    assert fake_nvidia_smi.main(["-L"], A100, 100)[1].startswith(f"GPU 0: {A100} (UUID: GPU-")
    gputil = ("--query-gpu=index,uuid,utilization.gpu,memory.total,memory.used,memory.free,"
              "driver_version,name,gpu_serial,display_active,display_mode,temperature.gpu,"
              "compute_cap")  # GPUtil.getGPUs()
    code, text = fake_nvidia_smi.main([gputil, "--format=csv,noheader,nounits"], A100, 100,
                                      compute_cap="8.0")
    assert code == 0 and len(text.split(", ")) == 13 and text.rstrip().endswith(", 8.0")
    memory = fake_nvidia_smi.main(["-q", "-d", "MEMORY"], A100, 100)[1].splitlines()
    after_gpu = memory[memory.index("GPU 00000000:01:00.0"):][:5]  # grep -A4 GPU | grep Free
    assert any(line.split() == ["Free", ":", "100", "MiB"] for line in after_gpu)
    assert "0MiB / 100MiB" in fake_nvidia_smi.main([], A100, 100)[1]


def test_a_job_that_sizes_its_batch_from_nvidia_smi(tmp_path):
    """`subprocess` / `os.popen` (a shell pipeline) of nvidia-smi inside the job see the --gpu
    card, so the batch it picks (and the estimate) is the one it would pick on that card."""
    script = tmp_path / "smi_batch.py"
    script.write_text(
        "import os, subprocess, torch\n"
        "out = subprocess.run(['nvidia-smi', '--query-gpu=memory.free',\n"
        "                      '--format=csv,noheader,nounits'], capture_output=True, text=True)\n"
        "free_mib = int(out.stdout.split()[0])\n"
        "listed = os.popen('nvidia-smi -L | grep -c GPU').read().strip()\n"
        "print('free', free_mib, 'listed', listed)\n"
        "x = torch.empty(free_mib // 1024, 2**20, device='cuda')  # 4 MiB per GiB free\n"
    )
    log = tmp_path / "job.log"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--json", "--gpu", "a100-40gb",
         "--mode", "fake", "--job-log", str(log), "--", sys.executable, str(script)],
        capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "free 40536 listed 1" in log.read_text()
    result = json.loads(run.stdout)
    assert result["peak_allocated_bytes"] == 39 * 2**22
