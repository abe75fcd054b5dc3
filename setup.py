"""Shim so that tools without PEP 517 support can still install tfdist."""
from setuptools import setup

setup()
