"""nbscale's version: written only in pyproject.toml, and read here from the installed package's metadata."""

from __future__ import annotations

import importlib.metadata


def installed_version() -> str:
    """The installed package's version; "0+unknown" when nbscale is imported from a folder it was never installed
    from."""
    try:
        return importlib.metadata.version("nbscale")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
