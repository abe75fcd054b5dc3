"""``python -m tfdist.check``: runs the CLI of ``tfdist.check.cli``."""

from tfdist.check.cli import entry

if __name__ == "__main__":
    entry()
