from .dtypes import elem_type_name, np_dtype, onnx_elem_type, torch_dtype
from .graph import Graph, Node, Value

__all__ = ["Graph", "Node", "Value", "torch_dtype", "np_dtype", "onnx_elem_type", "elem_type_name"]
