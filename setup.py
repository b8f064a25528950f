"""The package list and the one compiled module, beside pyproject.toml (which holds
everything else).

The BPF sources stay at the top of the checkout (probes/) and are shipped inside the
package as `gputrace.probes`: setuptools' package-dir maps that one subpackage to
probes/, which a `[tool.setuptools.packages.find]` table cannot combine with.

`gputrace.importers._entry_scan` (the compiled reader of a PyTorch snapshot's trace
entries, docs/importers.md) is optional: where no C compiler or Python headers are,
the install goes on without it and the importer reads the same entries in Python."""

from setuptools import Extension, find_packages, setup

setup(
    packages=[*find_packages(include=["gputrace", "gputrace.*"]), "gputrace.probes"],
    package_dir={"gputrace.probes": "probes"},
    ext_modules=[Extension("gputrace.importers._entry_scan",
                           ["gputrace/importers/_entry_scan.c"], optional=True)],
)
