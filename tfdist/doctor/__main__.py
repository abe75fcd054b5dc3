"""``python -m tfdist.doctor``."""

from tfdist.doctor.cli import entry

if __name__ == "__main__":
    entry()
