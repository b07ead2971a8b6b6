"""Lightning's CLI docs (docs/source-pytorch/cli/lightning_cli_intermediate.rst), `main.py`:
`LightningCLI(DemoModel, BoringDataModule)` from `lightning.pytorch.demos.boring_classes`, run as
`python main.py fit --config config.yaml`: the subcommand, a YAML config of trainer, model, data
and optimizer / lr_scheduler sections (lightning_cli_intermediate_2.rst: an `optimizer:` given in
the config replaces the model's `configure_optimizers`), and dotted overrides after it
(`--trainer.max_epochs=2`). See r9_lightning_cli_config.yaml."""
# main.py
from lightning.pytorch.cli import LightningCLI

# simple demo classes for your convenience
from lightning.pytorch.demos.boring_classes import BoringDataModule, DemoModel


def cli_main():
    cli = LightningCLI(DemoModel, BoringDataModule)  # noqa: F841
    # note: don't call fit!!


if __name__ == "__main__":
    cli_main()
    # note: it is good practice to implement the CLI in a function and call it in the main if block
