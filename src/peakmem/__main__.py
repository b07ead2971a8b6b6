"""`python -m peakmem ...` is the `peakmem` command."""

from peakmem.cli.main import main

if __name__ == "__main__":
    main()
