"""The project version: python/gradbridge/VERSION is its only definition (wheel, jar and POM read it)."""

from importlib import resources

__version__ = resources.files(__package__).joinpath("VERSION").read_text(encoding="utf-8").strip()
