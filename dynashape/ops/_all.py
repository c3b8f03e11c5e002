"""Imports every op module so that their registrations run."""

from . import elementwise, generators  # noqa: F401
