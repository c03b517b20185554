"""Parts of `bench/device_suite.py`: one module per measurement, each returning a JSON-able dict.

Every part returns {"status": "ok" | "skipped" | "failed", "reason": ..., ...figures}; a part
that would overrun the time budget or needs hardware this machine lacks is "skipped" with the
reason, never silently left out.
"""
