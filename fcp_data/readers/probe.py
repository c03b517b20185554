"""Moved to `fcp_data.vision.probe` (media I/O sits with the decoder); kept for old imports."""

from ..vision.probe import BACKENDS, Backend, Prober, ProbeTimeout, probe_fields

__all__ = ["BACKENDS", "Backend", "ProbeTimeout", "Prober", "probe_fields"]
