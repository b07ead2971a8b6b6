"""`peakmem pack` and `peakmem estimate --emit` through the CLI: the JSON contract, errors."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from peakmem.cli.main import main

G = 2**30


def run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture
def estimates(tmp_path):
    paths = []
    for name, gib in (("a", 10), ("b", 20), ("c", 15), ("d", 30), ("e", 50)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({
            "peak_bytes": int(gib * G / 1.015), "peak_bytes_with_margin": gib * G,
            "safety_margin": 0.015, "gpu": "a100-40gb", "capacity_bytes": 42505076736,
            "peak_reserved_bytes": int(gib * G * 0.9), "alloc_conf": "",
        }))
        paths.append(str(path))
    return paths


def test_pack_json_contract(estimates):
    result = run("pack", *estimates, "--gpus", "2xa100-40gb", "--policy", "first-fit", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # first-fit: a(10) -> 0, b(20) -> 0, c(15) -> 1, d(30) -> none (0 has 9.6, 1 has 24.6 GiB), e too big
    assert [(g["gpu"], g["index"], g["jobs"]) for g in data["gpus"]] == [
        ("a100-40gb", 0, ["a.json", "b.json"]), ("a100-40gb", 1, ["c.json"]),
    ]
    assert data["gpus"][0]["bytes_with_margin"] == 30 * G
    assert data["gpus"][0]["capacity_bytes"] == 42505076736
    assert [r["job"] for r in data["rejected"]] == ["d.json", "e.json"]
    assert all(isinstance(r["why"], str) and r["why"] for r in data["rejected"])
    assert data["oom_risk_any"] == pytest.approx(1 - 0.99**3, abs=1e-6)


def test_pack_human_table_and_mig(estimates):
    result = run("pack", *estimates, "--gpus", "a100-40gb,h100-80gb:3g.40gb+2g.20gb+1g.10gb")
    assert result.exit_code == 0
    assert "h100-80gb/3g.40gb" in result.stdout and "rejected e.json" in result.stdout
    assert "OOM" in result.stdout


def test_pack_what_if(estimates):
    result = run("pack", *estimates, "--what-if", "--json")
    data = json.loads(result.stdout)
    assert data["best"] == "h200"
    counts = {w["gpu"]: w["count"] for w in data["what_if"]}
    assert counts["a100-40gb"] is None and counts["a100-80gb"] == 2
    only = json.loads(run("pack", *estimates[:4], "--what-if", "--gpus", "l4,a100-40gb", "--json").stdout)
    assert [w["gpu"] for w in only["what_if"]] == ["a100-40gb", "l4"]
    assert "which single GPU" in run("pack", *estimates, "--what-if").stdout


def test_pack_emit(estimates):
    result = run("pack", *estimates[:3], "--gpus", "a100-40gb:3g.20gb+3g.20gb", "--emit", "k8s-mig",
                 "--emit-option", "image=repo/x:1")
    pods = [doc for doc in yaml.safe_load_all(result.stdout)]
    # 3g.20gb slices hold 20e9 bytes (18.6 GiB): b (20 GiB) fits neither
    assert sorted(p["metadata"]["name"] for p in pods) == ["a-json", "c-json"]
    for pod in pods:  # each job gets the slice it was placed on
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": "1"}
    data = json.loads(run("pack", *estimates[:2], "--gpus", "2xa100-40gb", "--emit", "slurm",
                          "--mib-per-shard", "1024", "--json").stdout)
    assert data["emit"] == {"b.json": "#SBATCH --gres=shard:20", "a.json": "#SBATCH --gres=shard:10"}


@pytest.mark.parametrize(
    "args, says, code",
    [
        (["--gpus", "l4"], "give estimate JSON files", 2),
        (["{a}"], "--gpus is required", 2),
        (["{a}", "--gpus", "2xnope"], "unknown GPU", 2),
        (["{a}", "--gpus", "l4", "--policy", "utilization-aware"], "utilization.smact", 3),
        (["{a}", "--gpus", "l4", "--policy", "nope"], "nope", 2),
        (["{a}", "--gpus", "l4", "--max-smact", "nan"], "nan", 2),
        (["{bad}", "--gpus", "l4"], "not JSON", 2),
        (["{error}", "--gpus", "l4"], "estimate failed", 2),
        (["missing.json", "--gpus", "l4"], "no such file", 2),
        (["{a}", "--gpus", "l4", "--emit-option", "noequals", "--emit", "hami"], "KEY=VALUE", 2),
    ],
)
def test_pack_failures_follow_the_contract(tmp_path, estimates, args, says, code):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "error.json").write_text(json.dumps({"error": {"kind": "job_failed", "message": "boom"}}))
    paths = {"a": estimates[0], "bad": str(tmp_path / "bad.json"), "error": str(tmp_path / "error.json")}
    argv = [a.format(**paths) for a in args]
    result = run("pack", *argv, "--json")
    assert result.exit_code == code
    error = json.loads(result.stdout)["error"]
    assert says in error["message"] and error["exit_code"] == code
    assert "Traceback" not in result.output


def test_pack_jobs_file_estimates_and_rejects_failures(tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        "# two jobs\n"
        + json.dumps({"id": "mlp", "command": ["python", "-m", "peakmem.examples.mlp_train"],
                      "options": {"steps": 1}}) + "\n\n"
        + json.dumps({"id": "gone", "command": ["python", "no_such_script.py"]}) + "\n"
    )
    result = run("pack", "--jobs", str(jobs), "--gpus", "l4", "--json", "--emit", "hami")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpus"][0]["jobs"] == ["mlp"] and data["gpus"][0]["gpu"] == "l4"
    assert data["rejected"][0]["job"] == "gone" and "not found" in data["rejected"][0]["why"]
    pod = yaml.safe_load(data["emit"]["mlp"])
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "peakmem.examples.mlp_train"]


@pytest.mark.parametrize(
    "line, says",
    [
        ("[1]", "expected an object"),
        ('{"id": "a"}', "`command`"),
        ('{"id": "a", "command": "python x.py"}', "`command`"),
        ('{"id": "", "command": ["x"]}', "`id`"),
        ('{"id": "a", "command": ["x"], "extra": 1}', "unknown keys"),
        ('{"id": "a", "command": ["x"], "options": {"evil": 1}}', "`options`"),
        ('{"id": "a", "command": ["x"]}\n{"id": "a", "command": ["y"]}', "twice"),
        ("", "no jobs"),
    ],
)
def test_bad_jobs_files(tmp_path, line, says):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(line + "\n")
    result = run("pack", "--jobs", str(jobs), "--gpus", "l4", "--json")
    assert result.exit_code == 2
    assert says in json.loads(result.stdout)["error"]["message"]


def test_estimate_emit():
    result = run("estimate", "--gpu", "a100-40gb", "--steps", "1", "--json", "--emit", "kai",
                 "--emit-option", "fraction=true", "--", "python", "-m", "peakmem.examples.mlp_train")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["peak_bytes_with_margin"] > 0 and data["emit_format"] == "kai"
    pod = yaml.safe_load(data["emit"])
    assert pod["metadata"]["name"] == "mlp-train"
    assert float(pod["metadata"]["annotations"]["gpu-fraction"]) >= (
        data["peak_bytes_with_margin"] / data["capacity_bytes"])


@pytest.mark.parametrize(
    "args, says",
    [
        (["--emit", "nope"], "nope"),
        (["--emit-option", "a=b"], "need --emit"),
        (["--emit", "slurm"], "shard size"),
        (["--gpu", "l4", "--emit", "k8s-mig"], "no MIG profiles"),
    ],
)
def test_estimate_emit_failures(args, says):
    result = run("estimate", "--steps", "1", "--json", *args, "--", "python", "-m",
                 "peakmem.examples.mlp_train")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert says in error["message"] and error["kind"] == "bad_input"


def test_hostile_estimate_files(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    huge_int = tmp_path / "int.json"
    huge_int.write_text('{"peak_bytes": ' + "9" * 5000 + "}")
    inf = tmp_path / "inf.json"
    inf.write_text('{"peak_bytes": 1e999, "peak_bytes_with_margin": 1e999}')
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    for path, says in ((deep, "not usable JSON"), (huge_int, "not usable JSON"),
                       (inf, "peak_bytes"), (binary, "UTF-8"), (tmp_path, "directory"),
                       ("/dev/zero", "not a regular file")):
        result = run("pack", str(path), "--gpus", "l4", "--json")
        assert result.exit_code == 2, (path, result.output)
        assert says in json.loads(result.stdout)["error"]["message"]


def test_untrusted_names_cannot_inject_markup_or_lines(tmp_path, capsys):
    evil = "x\n#SBATCH --gres=gpu:8 [bold red]boom[/]"
    estimate = {"peak_bytes": G, "peak_bytes_with_margin": G, "gpu": "l4",
                "capacity_bytes": 24152899584}
    renamed = tmp_path / "[bold]x.json"
    renamed.write_text(json.dumps(estimate))
    table = run("pack", str(renamed), "--gpus", "l4")
    assert "[bold]x.json" in table.stdout
    # a jobs-file id with a newline stays on its comment line in the Slurm script
    from peakmem.cli.pack import _print_snippets

    capsys.readouterr()
    _print_snippets("slurm", {evil: "#SBATCH --gres=shard:1"}, {})
    text = capsys.readouterr().out
    assert [line for line in text.splitlines() if line.startswith("#SBATCH")] == ["#SBATCH --gres=shard:1"]


def test_emit_refuses_non_finite_and_bad_labels():
    from peakmem.schedule.emit import EmitError, render

    base = {"peak_bytes_with_margin": G, "capacity_bytes": 40 * G, "gpu": "a100-40gb"}
    for bad in ({**base, "peak_bytes_with_margin": float("inf")}, {**base, "capacity_bytes": float("nan")},
                {**base, "peak_bytes_with_margin": True}):
        with pytest.raises(EmitError):
            render(bad, "hami")
    assert "0.0001" not in render({**base, "peak_reserved_bytes": float("inf")}, "torch")
    with pytest.raises(EmitError, match="label value"):
        render(base, "kai", queue="bad queue\nname")
    with pytest.raises(EmitError, match="label key"):
        render(base, "kai", queue="q", queue_label="Bad Key")
