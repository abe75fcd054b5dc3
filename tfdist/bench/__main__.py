"""``python -m tfdist.bench``: runs the CLI of ``tfdist.bench.cli``."""

from tfdist.bench.cli import entry

if __name__ == "__main__":
    entry()
