"""Core helpers every tier uses: C object ownership (``handle``), the argument validators (``args``), tensor
types, system memory, the library itself and OpenBLAS. Imports only ``_ffi`` and ``errors``."""
