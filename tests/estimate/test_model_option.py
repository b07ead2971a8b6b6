"""`peakmem estimate --model CONFIG`: a standard training script for a transformers config."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import peakmem.estimate
from peakmem.cli.main import main
from peakmem.scriptgen import ConfigError, TrainingSpec, find_config, render_script

LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 1000, "max_position_embeddings": 1024}
BERT = {"model_type": "bert", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 1000,
        "max_position_embeddings": 512}


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, Path]:
    paths = {}
    for name, config in (("llama", LLAMA), ("bert", BERT)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config))
        paths[name] = path
    return paths


@pytest.fixture
def in_process(monkeypatch):
    """The CLI's estimates run in this process (faster than a supervised child)."""
    real = peakmem.estimate.estimate_command

    def run(argv, **kwargs):
        for key in ("job_log", "sandbox", "max_host_memory"):
            kwargs.pop(key, None)
        return real(argv, isolate=False, **kwargs)

    monkeypatch.setattr(peakmem.estimate, "estimate_command", run)


def _estimate(*args: str) -> dict:
    out = CliRunner().invoke(main, ["estimate", "--json", "--gpu", "l4", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout.strip().splitlines()[-1])


def _params(config: dict) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = dict(config)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(settings.pop("model_type"), **settings))
    return sum(p.numel() for p in model.parameters())


def test_llama_causal_lm(configs, in_process) -> None:
    result = _estimate("--model", str(configs["llama"]), "--batch", "2", "--seq", "64",
                       "--precision", "fp32")
    assert result["estimate_kind"] == "training" and result["steps"] >= 3
    params = _params(LLAMA)
    assert result["breakdown"]["parameter"] == pytest.approx(4 * params, rel=0.02)
    assert result["breakdown"]["optimizer_state"] == pytest.approx(8 * params, rel=0.02)


def test_bert_sequence_classification(configs, in_process) -> None:
    result = _estimate("--model", str(configs["bert"]), "--task", "seq-cls", "--batch", "4",
                       "--seq", "128", "--optimizer", "sgd", "--precision", "bf16")
    assert result["estimate_kind"] == "training"
    # SGD with momentum: one buffer per parameter, as large as the (bf16) weights
    assert result["breakdown"]["optimizer_state"] == pytest.approx(
        result["breakdown"]["parameter"], rel=0.05)


def test_gradient_checkpointing_saves_activations(configs, in_process) -> None:
    args = ["--model", str(configs["llama"]), "--batch", "8", "--seq", "512"]
    plain = _estimate(*args)
    checkpointed = _estimate(*args, "--gradient-checkpointing")
    assert checkpointed["peak_allocated_bytes"] < plain["peak_allocated_bytes"]


def test_lora_trains_adapters_only(configs, in_process) -> None:
    out = CliRunner().invoke(main, ["estimate", "--json", "--model", str(configs["llama"]),
                                    "--lora-rank", "4", "--seq", "64"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["breakdown"]["optimizer_state"] < result["breakdown"]["parameter"] / 10


def test_print_script(configs) -> None:
    out = CliRunner().invoke(main, ["estimate", "--model", str(configs["bert"]), "--task",
                                    "masked-lm", "--lora-rank", "8", "--gradient-checkpointing",
                                    "--precision", "amp-fp16", "--optimizer", "adafactor",
                                    "--print-script"])
    assert out.exit_code == 0, out.output
    script = out.stdout
    compile(script, "train.py", "exec")
    for text in ("AutoModelForMaskedLM", "LoraConfig(r=8", "gradient_checkpointing_enable()",
                 "GradScaler", "torch.float16", "Adafactor(", 'device="cuda"'):
        assert text in script


def test_printed_script_takes_the_fit_knobs(configs, tmp_path: Path, in_process) -> None:
    out = CliRunner().invoke(main, ["estimate", "--model", str(configs["llama"]), "--batch", "2",
                                    "--seq", "64", "--print-script"])
    script = tmp_path / "train.py"
    script.write_text(out.stdout)
    small = _estimate("--", sys.executable, str(script))
    bigger = _estimate("--", sys.executable, str(script), "--batch-size", "8", "--seq-len", "256")
    assert bigger["peak_allocated_bytes"] > small["peak_allocated_bytes"]


def test_hostile_config_values_stay_data() -> None:
    config = dict(BERT, name_or_path="x'''\nimport os; os.system('boom')\n'''\"\\")
    script = render_script(TrainingSpec(task="seq-cls"), config, "evil'''\"\nsource")
    tree = ast.parse(script)
    assigned = [node for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "CONFIG"]
    (node,) = assigned
    literal = node.value.args[0].value  # json.loads('<a string literal>')
    assert json.loads(literal) == config
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert "system" not in calls


def test_config_sources(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    assert find_config(str(folder))[0] == LLAMA
    # a Hub id from the local Hugging Face cache, offline
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-llama" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(LLAMA))
    (cache / "models--acme--tiny-llama" / "refs").mkdir()
    (cache / "models--acme--tiny-llama" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    config, where = find_config("acme/tiny-llama")
    assert config == LLAMA and where.endswith("config.json")
    with pytest.raises(ConfigError, match="local Hugging Face cache"):
        find_config("acme/not-cached")


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not a JSON config"),
        ("[1, 2]", "not a JSON object"),
        ('{"hidden_size": 8}', "no model_type"),
        ('{"model_type": "evil_remote_code_model"}', "not one transformers knows"),
    ],
)
def test_bad_configs(tmp_path: Path, content: str, match: str, in_process) -> None:
    """The first three in the estimate's process; the model type in the job, where
    transformers is imported (scriptgen.config_check): both bad input, exit 2."""
    path = tmp_path / "config.json"
    path.write_text(content)
    out = CliRunner().invoke(main, ["estimate", "--json", "--model", str(path)])
    assert out.exit_code == 2
    assert match in json.loads(out.stdout)["error"]["message"]


@pytest.mark.parametrize(
    "args, match",
    [
        (["--model", "llama", "--", "python", "t.py"], "not both"),
        ([], "give the job's command"),
        (["--lora-rank", "4", "--", "python", "t.py"], "go with --model"),
        (["--model", "/no/such/config.json"], "not a config.json"),
        (["--model", "x.json", "--task", "translation"], "Invalid value for '--task'"),
    ],
)
def test_bad_model_usage(args: list[str], match: str) -> None:
    out = CliRunner().invoke(main, ["estimate", "--json", *args])
    assert out.exit_code == 2
    assert match in json.loads(out.stdout)["error"]["message"]


def test_the_estimated_script_checks_the_config_with_peakmem_and_the_printed_one_stands_alone(
        configs) -> None:
    """The script peakmem runs builds the config with `built_config` (transformers' check
    reported as bad input, in the job); the printed one calls AutoConfig.for_model itself
    and needs no peakmem. Both build the same config."""
    from peakmem.scriptgen.config_check import built_config

    printed = render_script(TrainingSpec(), LLAMA, str(configs["llama"]))
    checked = render_script(TrainingSpec(), LLAMA, str(configs["llama"]), checked=True)
    assert "peakmem" not in printed.split('"""', 2)[2]  # the docstring names it, no code does
    assert 'config = AutoConfig.for_model(settings.pop("model_type"), **settings)' in printed
    assert f"config = built_config(CONFIG, {str(configs['llama'])!r})" in checked
    assert "AutoConfig.for_model" not in checked
    from transformers import AutoConfig

    settings = dict(LLAMA)
    assert (built_config(LLAMA, "x").to_dict()
            == AutoConfig.for_model(settings.pop("model_type"), **settings).to_dict())


def test_print_script_checks_the_config_with_transformers(tmp_path: Path) -> None:
    """No job runs for --print-script: transformers' check runs in peakmem's process."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA, hidden_size="big")))
    out = CliRunner().invoke(main, ["estimate", "--json", "--model", str(path), "--print-script"])
    assert out.exit_code == 2, out.output
    message = json.loads(out.stdout)["error"]["message"]
    assert "transformers refuses the config" in message and "hidden_size" in message
