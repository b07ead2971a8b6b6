"""The `peakmem` command line: one module per command, registered in `main.COMMANDS`."""
