"""Imports every op module so that their registrations run."""

from . import (  # noqa: F401
    control_flow,
    conv,
    data_dependent,
    elementwise,
    generators,
    indexing,
    linalg,
    norm,
    pool,
    reduce,
    softmax,
    tensor,
)
