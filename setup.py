"""The packages, computed: every package under tfdist/, and ``tfdist.experiments`` mapped to configs/experiments/.

``configs/experiments/`` is the one copy of the named YAML experiments that
``--config`` takes; the wheel ships it as ``tfdist/experiments/*.yaml``
(``package_dir``), so ``--config quick`` works from a wheel installed anywhere.
setup.cfg's ``packages = find:`` cannot add a package that is not a folder of
tfdist/, hence this file; everything else is in setup.cfg.
"""
from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["tfdist", "tfdist.*"]), "tfdist.experiments"],
    package_dir={"tfdist.experiments": "configs/experiments"},
    package_data={"tfdist.experiments": ["*.yaml"]},
)
