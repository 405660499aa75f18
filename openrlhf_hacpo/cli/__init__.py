"""Command-line entry points (``python -m openrlhf_hacpo.cli.<name>``)."""
