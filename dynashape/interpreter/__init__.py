"""The interpreter: the per-node flow of the design notes, one PrimitiveInst per node.

The reference the generated code is tested against, what names a failing node, and what runs
where no specialization serves (counted).
"""
