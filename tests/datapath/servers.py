"""Real servers on 127.0.0.1 for remote-shard tests: a Range-honouring HTTP server with fault
injection (a threading `http.server` subclass) and moto's S3 server mode."""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["RangeServer"]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so clients can reuse connections
    server: RangeServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _serve(self, *, head: bool) -> None:
        srv = self.server
        with srv.lock:
            srv.requests.append((self.command, self.path, self.headers.get("Range")))
            srv.peers.add(self.client_address[1])
            fail = srv.fail_next > 0 and not head
            srv.fail_next -= fail
            cut = srv.cut_next > 0 and not head and self.headers.get("Range") is not None
            srv.cut_next -= cut
        if srv.status is not None:
            return self._empty(srv.status)
        if fail:
            return self._empty(500)
        path = srv.root / self.path.lstrip("/")
        if not path.is_file():
            return self._empty(404)
        data = path.read_bytes()
        st = path.stat()
        start, end, status = 0, len(data), 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
        if m and not srv.ignore_range:
            start = int(m.group(1))
            end = min(len(data), int(m.group(2)) + 1 if m.group(2) else len(data))
            status = 206
        claimed = (start, end)  # what Content-Range says
        if status == 206 and srv.shift:  # other bytes: said honestly, or (lie) not
            start, end = start + srv.shift, min(len(data), end + srv.shift)
            claimed = claimed if srv.lie else (start, end)
        body = data[start:end]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if srv.etags:
            self.send_header("ETag", f'"{st.st_size:x}-{st.st_mtime_ns:x}"')
        if status == 206:
            self.send_header("Content-Range", f"bytes {claimed[0]}-{claimed[1] - 1}/{len(data)}")
        self.end_headers()
        if head:
            return None
        if srv.stall_s and status == 206:  # half the body, then silence
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            time.sleep(srv.stall_s)
            self.close_connection = True
            return None
        if cut:  # promise the whole body, send half, drop the connection
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return None
        self.wfile.write(body)
        return None


class RangeServer(ThreadingHTTPServer):
    """Serves files under `root`; `fail_next` GETs answer 500, `cut_next` range GETs are cut
    short, `status` (e.g. 403) answers every request; `requests` logs (method, path, range).
    Misbehaviours: `ignore_range` answers 200 with the whole file; `shift` serves the bytes
    `shift` further on, with a Content-Range saying so, or (`lie`) claiming the asked range;
    `etags=False` sends no ETag; `stall_s` sends half a range body, then nothing for so long."""

    daemon_threads = True
    request_queue_size = 128  # http.server's 5 drops SYNs of concurrent range requests

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = root
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, str | None]] = []
        self.peers: set[int] = set()  # client ports seen: fewer than requests = reused
        self.fail_next = 0
        self.cut_next = 0
        self.status: int | None = None
        self.ignore_range = False
        self.shift = 0
        self.lie = False
        self.etags = True
        self.stall_s = 0.0
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> RangeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)
