"""A local HTTP server that answers the Hugging Face Hub requests vramplan makes, so no test opens a network
connection.

It imitates ``{endpoint}/{owner}/{name}/resolve/{revision}/{filename}`` as huggingface_hub 2.4.0 reads it
(``file_download.get_hf_file_metadata`` and ``_get_metadata_or_catch_error``; ``utils/_http.py``
``hf_raise_for_status``): HEAD and GET answer with ``ETag`` and ``X-Repo-Commit`` (the commit a branch
resolves to) and ``Content-Length``; a ``Range: bytes=a-b`` GET answers 206 with those bytes; a gated
repository answers 401 with ``X-Error-Code: GatedRepo`` unless the request carries its token; a missing
repository 404 ``RepoNotFound``, a missing file 404 ``EntryNotFound`` (with ``X-Repo-Commit``), an unknown
revision 404 ``RevisionNotFound``.  A safetensors file is served from its header and a declared size (the
tensor data reads as zeros), so a 7B checkpoint costs a few kilobytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "U8": 1, "F8_E4M3": 1, "I64": 8}


@dataclass
class Blob:
    """A file's first bytes and its full size (the rest reads as zeros)."""

    head: bytes
    size: int = -1

    def __post_init__(self) -> None:
        if self.size < 0:
            self.size = len(self.head)

    def read(self, start: int, end: int) -> bytes:
        end = min(end, self.size - 1)
        if start > end:
            return b""
        part = self.head[start:end + 1]
        return part + b"\0" * (end + 1 - start - len(part))


def safetensors(tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None) -> Blob:
    """A safetensors file of ``{name: (dtype, shape)}``: the 8-byte length, the JSON header, the data's size."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = _BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    return Blob(struct.pack("<Q", len(raw)) + raw, 8 + len(raw) + offset)


@dataclass
class Repo:
    files: dict[str, Blob]
    commit: str = ""
    gated_token: str | None = None  # gated: only a request with this bearer token reads it

    def __post_init__(self) -> None:
        if not self.commit:
            self.commit = hashlib.sha1(repr(sorted(self.files)).encode()).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, Repo] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, authorization)
    ignore_range: bool = False  # a hostile server: 200 with the whole file whatever Range says
    url: str = ""

    def add(self, repo_id: str, files: dict[str, Any], gated_token: str | None = None) -> Repo:
        blobs = {k: v if isinstance(v, Blob) else Blob(v if isinstance(v, bytes) else json.dumps(v).encode())
                 for k, v in files.items()}
        self.repos[repo_id] = Repo(blobs, gated_token=gated_token)
        return self.repos[repo_id]


_PATH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, code: int, headers: dict[str, str], body: bytes, head: bool) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _error(self, code: int, error_code: str, head: bool, extra: dict[str, str] | None = None) -> None:
            self._answer(code, {"X-Error-Code": error_code, "X-Error-Message": error_code, **(extra or {})},
                         b'{"error": "' + error_code.encode() + b'"}', head)

        def _serve(self, head: bool) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Authorization", "")))
            m = _PATH.match(self.path)
            repo = hub.repos.get(m["repo"]) if m else None
            if m is None or repo is None:
                return self._error(404, "RepoNotFound", head)
            if repo.gated_token is not None and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
                return self._error(401, "GatedRepo", head)
            if m["rev"] not in ("main", repo.commit):
                return self._error(404, "RevisionNotFound", head)
            blob = repo.files.get(m["file"])
            commit = {"X-Repo-Commit": repo.commit}
            if blob is None:
                return self._error(404, "EntryNotFound", head, commit)
            etag = '"' + hashlib.sha1(blob.head + str(blob.size).encode()).hexdigest() + '"'
            headers = {**commit, "ETag": etag, "Accept-Ranges": "bytes"}
            rng = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
            if head:
                return self._answer(200, {**headers, "Content-Length": str(blob.size)}, b"", True)
            if rng is None or hub.ignore_range:
                # the whole file, written in pieces (a client that stops reading closes the connection)
                self.send_response(200)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(blob.size))
                self.end_headers()
                try:
                    for start in range(0, blob.size, 1 << 20):
                        self.wfile.write(blob.read(start, start + (1 << 20) - 1))
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True
                return None
            a, b = int(rng[1]), int(rng[2])
            if a >= blob.size:
                return self._answer(416, {"Content-Range": f"bytes */{blob.size}"}, b"", False)
            body = blob.read(a, b)
            return self._answer(206, {**headers, "Content-Range": f"bytes {a}-{a + len(body) - 1}/{blob.size}"},
                                body, False)

        def do_HEAD(self) -> None:
            self._serve(True)

        def do_GET(self) -> None:
            self._serve(False)

    return Handler


def serve(hub: FakeHub) -> Iterator[FakeHub]:
    """Run ``hub`` on a free local port for the life of the generator."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    hub.url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield hub
    finally:
        srv.shutdown()
        srv.server_close()
