from .dimension import Dimension, DimLike, dim_ceildiv, is_placeholder
from .partial_shape import PartialShape, broadcast_dim, broadcast_dims

__all__ = ["Dimension", "DimLike", "PartialShape", "broadcast_dim", "broadcast_dims", "dim_ceildiv", "is_placeholder"]
