"""The package list, found rather than written out, so that a new subpackage ships without editing
this file: every package under gemmgen/, plus the Jinja templates, which live in templates/ at the
top of the checkout and install as gemmgen.templates ([tool.setuptools.package-dir] in
pyproject.toml maps them), and the shipped libraries' manifests, which live in generated/ and install
as gemmgen.libraries. Everything else is in pyproject.toml; pyproject's own `packages.find`
cannot add a package that lies outside the folder it searches."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["gemmgen", "gemmgen.*"]) + ["gemmgen.templates", "gemmgen.libraries"])
