"""Rows packed in memory: every column of a row side by side, and the kernels that move them.

:class:`~torchstore.data.rows.packed.PackedColumns` is the in-memory block that replay rings,
resident stores and windows keep their rows in (one block per dtype, a row's columns side by
side); :mod:`~torchstore.data.rows.packed_plan` cuts batches out of gathered blocks;
:mod:`~torchstore.data.rows.rowgather` and :mod:`~torchstore.data.rows.rowcopy` are the
compiled CPU gather and write (numba, loaded on first use);
:mod:`~torchstore.data.rows.recycled` keeps batch buffers for reuse. Imports the column
declarations (:mod:`torchstore.data.columns`) and nothing that reads a file.
"""
