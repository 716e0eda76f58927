"""Demonstration formats in and out of stores: robomimic-layout HDF5 (robomimic, MimicGen,
LIBERO, Isaac Lab), diffusion-policy zarr and RLDS (Open X-Embodiment), plus the sniffing
that tells them (and the other formats torchstore reads) apart.

Names are imported on first use, so ``import torchstore.formats`` costs nothing until one
is read.
"""

from torchstore._lazy import lazy_exports

_EXPORTS = {
    "import_robomimic": ".robomimic",
    "export_robomimic": ".robomimic_export",
    "import_rlds": ".rlds",
    "locate_rlds": ".rlds",
    "import_zarr": ".zarr_import",
    "export_zarr": ".zarr_export",
    "sniff_format": ".sniff",
    "FORMATS": ".sniff",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
