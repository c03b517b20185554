"""Remote shards: http(s):// and s3:// (gs:// with gcsfs) read through fsspec.

Why fsspec: one interface over HTTP (aiohttp: one pooled keep-alive session per process, so
range requests reuse connections), S3 (s3fs over aiobotocore: credentials, regions, custom
endpoints such as MinIO) and GCS, with concurrent range reads (`cat_ranges`) for read-ahead;
it is what pandas, dask and Hugging Face datasets use for the same job. Install the `remote`
extra (`pip install 'fcp[remote]'`: fsspec, aiohttp, s3fs).

Three jobs, one module each: reaching the store with retries and fingerprints (`access`), one
verified range request (`ranges`), and reading shards by stream or by range (`reader`). This
face is what the readers, the loader and users import.
"""

from __future__ import annotations

from .access import (
    RangeAnswerError,
    RemoteAccessError,
    RemoteOptions,
    is_remote,
    parse_fingerprint,
    remote_filesystem,
    remote_fingerprint,
    with_retries,
)
from .reader import RemoteReader, RemoteStream, merge_ranges

__all__ = [
    "RangeAnswerError",
    "RemoteAccessError",
    "RemoteOptions",
    "RemoteReader",
    "RemoteStream",
    "is_remote",
    "merge_ranges",
    "parse_fingerprint",
    "remote_filesystem",
    "remote_fingerprint",
    "with_retries",
]
