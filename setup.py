"""The package list, beside pyproject.toml (which holds everything else).

The BPF sources stay at the top of the checkout (probes/) and are shipped inside the
package as `gputrace.probes`: setuptools' package-dir maps that one subpackage to
probes/, which a `[tool.setuptools.packages.find]` table cannot combine with."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["gputrace", "gputrace.*"]), "gputrace.probes"],
    package_dir={"gputrace.probes": "probes"},
)
