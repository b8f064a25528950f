"""One module per CLI command; each exposes a plain function the CLI calls."""
