"""``python -m tfdist.doctor``: runs the CLI of ``tfdist.doctor.cli``."""

from tfdist.doctor.cli import entry

if __name__ == "__main__":
    entry()
