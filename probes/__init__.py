"""The recorder's BPF C sources, shipped inside the package as `gputrace.probes`
(package data; setup.py maps this directory). gputrace.record.loader.probes_dir finds
them, in a checkout or an installed package."""
