"""A model by Hugging Face Hub id (``owner/name[@revision]``) that is not in the catalog.

``load_model`` (``catalog/models.py``) comes here only after the catalog and the local paths: the
repository's ``config.json`` (and ``generation_config.json`` when it has one) is fetched with
``huggingface_hub.hf_hub_download`` into the standard Hugging Face cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``), from ``HF_ENDPOINT`` (else https://huggingface.co), with the token huggingface_hub
finds (``HF_TOKEN`` or ``hf auth login``; ``vramplan --token`` sets ``HF_TOKEN`` for one run).  Offline
first: a file already in the cache answers without a request; ``HF_HUB_OFFLINE=1`` (or
``TRANSFORMERS_OFFLINE=1``) and the scenario's ``offline: true`` (``--offline``) forbid requests.

The checkpoint's tensors are read from the safetensors headers by HTTP range request (the first 8 bytes
give the header's length, the JSON header each tensor's dtype, shape and byte offsets: the safetensors
format), the way ``HfApi.parse_safetensors_file_metadata`` does (huggingface_hub 2.4.0 ``hf_api.py``:
a first read of 100,000 bytes, a second only for a longer header, at most
``constants.SAFETENSORS_MAX_HEADER_LENGTH`` = 25,000,000 bytes), but streamed and cut at the bytes asked
for, so that a server that ignores ``Range`` cannot make it read a whole checkpoint.  The parsed sums
are kept beside the hub cache (``<hub cache>/../vramplan/safetensors/``), so a second run needs no
network.

A config.json is data: it goes through the family adapters like a local file, and no code named in it
(``auto_map``) is fetched or run (``trust_remote_code`` is never used).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.hf_config import SUPPORTED_MODEL_TYPES, model_from_config
from vramplan.spec.load import MAX_DOCUMENT_BYTES, parse_text, read_bounded_text
from vramplan.spec.model import CheckpointFiles, ModelSpec

__all__ = [
    "HUB_ID", "MAX_HEADER_BYTES", "MAX_INDEX_BYTES", "HubModel", "HubOptions", "checkpoint_notes", "fetch_hub_model",
    "hub_model_spec", "parse_hub_id",
]

# owner/name as the Hub spells repository ids (huggingface_hub ``utils/_validators.py`` validate_repo_id:
# letters, digits, "-", "_", "." in each part, at most 96 characters), then an optional @revision (a branch,
# tag or commit; "refs/pr/1" has slashes)
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})"
                    r"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9_./-]{0,199}))?$")
MAX_HEADER_BYTES = 25_000_000
"""Longest safetensors header read (huggingface_hub ``constants.SAFETENSORS_MAX_HEADER_LENGTH``)."""
MAX_INDEX_BYTES = 64 << 20
"""Largest ``model.safetensors.index.json`` read (DeepSeek-V3's, 91,000 tensors, is under 9 MB)."""
_FIRST_READ = 100_000  # huggingface_hub's first range read: most headers fit (hf_api.py, PR #1855)
_MAX_SHARDS = 10_000
_SHARD = re.compile(r"^[A-Za-z0-9_.-][A-Za-z0-9_./-]{0,254}\.safetensors$")
# bits per element of the safetensors dtypes (safetensors ``Dtype``, tensor.rs, release 0.6)
_DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
               "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32,
               "C64": 64, "F64": 64, "I64": 64, "U64": 64}
_CACHE_VERSION = 1


def parse_hub_id(name: str) -> tuple[str, str] | None:
    """``(repo_id, revision)`` of ``owner/name[@revision]`` (revision ``main`` when none), else None."""
    m = HUB_ID.match(name.strip())
    if m is None or ".." in m["repo"] or ".." in (m["revision"] or ""):
        return None
    return m["repo"], m["revision"] or "main"


def _env_true(name: str) -> bool:
    # huggingface_hub constants._is_true
    return os.environ.get(name, "").upper() in {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubOptions:
    """Where and how Hub files are read; empty fields take huggingface_hub's environment variables at call time."""

    offline: bool = False
    endpoint: str = ""
    cache_dir: str = ""
    timeout_s: float = 10.0

    def resolved(self) -> HubOptions:
        """The options with the environment applied (``HF_HUB_OFFLINE``, ``HF_ENDPOINT``, ``HF_HUB_CACHE``,
        ``HF_HOME``), read now rather than at import as huggingface_hub's constants are."""
        offline = self.offline or _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE")
        endpoint = (self.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "huggingface")
        cache = self.cache_dir or os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or \
            os.path.join(home, "hub")
        return HubOptions(offline, endpoint, os.path.expanduser(os.path.expandvars(cache)), self.timeout_s)


@dataclass(frozen=True)
class HubModel:
    """What was read for one Hub id: the config, the commit it was read at, the checkpoint's tensors."""

    repo_id: str
    revision: str
    commit: str
    config: dict[str, Any]
    checkpoint: CheckpointFiles | None
    notes: tuple[str, ...]
    source: str


def _problem(message: str, hint: str = "", where: str = "model") -> ScenarioError:
    return ScenarioError([Problem(where, message, hint)])


def _http_error_types() -> tuple[type[BaseException], ...]:
    """The transport's exception base (httpx for huggingface_hub 1.x, httpx2 for 2.x), from its client."""
    import importlib

    from huggingface_hub import get_session

    module = importlib.import_module(type(get_session()).__module__.split(".")[0])
    base = getattr(module, "HTTPError", None)
    return (OSError, base) if isinstance(base, type) and issubclass(base, BaseException) else (OSError,)


def _token_hint() -> str:
    return ("accept its terms on its Hub page if it is gated, then give a token that can read it: HF_TOKEN=..., "
            "`hf auth login`, or `vramplan --token ...`")


def _offline_problem(repo: str, revision: str, filename: str, opts: HubOptions, close: Iterable[str]) -> ScenarioError:
    near = list(close)
    did = f"did you mean {', '.join(repr(c) for c in near)} (catalog)? Else " if near else ""
    name = repo if revision == "main" else f"{repo}@{revision}"
    return _problem(f"unknown model {name!r}: not in the catalog, and its {filename} is not in the Hugging Face "
                    f"cache {opts.cache_dir} while the network is off (HF_HUB_OFFLINE=1 or --offline)",
                    f"{did}run once online (without --offline and HF_HUB_OFFLINE), or `hf download {repo} {filename}`, "
                    "or give the path of a local config.json")


def _map_error(exc: BaseException, repo: str, revision: str, filename: str, opts: HubOptions,
               close: Iterable[str] = ()) -> ScenarioError:
    """A huggingface_hub or transport error as the user's problem (never with the token)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    url = f"{opts.endpoint}/{repo}/resolve/{revision}/{filename}"
    if isinstance(exc, GatedRepoError):
        return _problem(f"{repo} is a gated repository: a token with access is needed to read {filename}",
                        _token_hint())
    if isinstance(exc, RepositoryNotFoundError):
        return _problem(f"no repository {repo} on {opts.endpoint} (or it is private or gated, and a token is needed)",
                        f"check the id (or the path, if a local folder was meant); for a private or gated one, "
                        f"{_token_hint()}")
    if isinstance(exc, RevisionNotFoundError):
        return _problem(f"{repo} has no revision {revision!r}", "give a branch, tag or commit of the repository")
    if isinstance(exc, RemoteEntryNotFoundError):
        return _problem(f"{repo} has no {filename} at revision {revision}",
                        "a transformers model repository has a config.json; give its id, or a local config.json")
    if isinstance(exc, HfHubHTTPError) and exc.response is not None and exc.response.status_code in (401, 403):
        return _problem(f"{repo}: {url} answered {exc.response.status_code} (a token with access is needed)",
                        _token_hint())
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return _problem(f"{repo}: {url} answered HTTP {exc.response.status_code}",
                        "try again later, or use --offline with a cached copy, or a local config.json")
    why = "no answer" if isinstance(exc, LocalEntryNotFoundError) else type(exc).__name__
    near = list(close)
    did = f"did you mean {', '.join(repr(c) for c in near)} (catalog)? Else " if near else ""
    return _problem(f"{repo}: cannot read {url} ({why}) and it is not in the Hugging Face cache {opts.cache_dir}",
                    f"{did}check the network or HF_ENDPOINT; or use --offline with a cached copy, or give the path "
                    "of a local config.json")


def _download(repo: str, revision: str, filename: str, opts: HubOptions, max_bytes: int,
              close: Iterable[str] = (), required: bool = True) -> str | None:
    """The cached path of one file of the repository: the cache first, then one download (its size checked
    from the HEAD answer before the download).  None for an optional file that the repository lacks."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url, try_to_load_from_cache
    from huggingface_hub.errors import RemoteEntryNotFoundError

    try:
        # the cache's answer (file_download.py try_to_load_from_cache): a path, a sentinel for a file the Hub
        # said the repository lacks (recorded under .no_exist/<commit>/), or None when the cache does not know
        cached = try_to_load_from_cache(repo, filename, cache_dir=opts.cache_dir, revision=revision)
    except ValueError as exc:  # an id or revision huggingface_hub refuses (validate_repo_id)
        raise _problem(f"{repo}@{revision} is not a Hub id huggingface_hub accepts ({exc})") from None
    if isinstance(cached, str):
        return cached
    if cached is not None and not required:
        return None
    if opts.offline:
        if not required:
            return None
        raise _offline_problem(repo, revision, filename, opts, close)
    try:
        meta = get_hf_file_metadata(hf_hub_url(repo, filename, revision=revision, endpoint=opts.endpoint),
                                    timeout=opts.timeout_s, endpoint=opts.endpoint)
        if meta.size is not None and meta.size > max_bytes:
            raise _problem(f"{repo}: {filename} is {meta.size:,} bytes, more than the {max_bytes:,} read",
                           "check the repository (a config.json is a few kilobytes)")
        return hf_hub_download(repo, filename, revision=revision, cache_dir=opts.cache_dir, endpoint=opts.endpoint,
                               etag_timeout=opts.timeout_s)
    except RemoteEntryNotFoundError as exc:
        if not required:
            return None
        raise _map_error(exc, repo, revision, filename, opts) from None
    except ScenarioError:
        raise
    except _http_error_types() + (ValueError,) as exc:
        raise _map_error(exc, repo, revision, filename, opts, close) from None


def _read_json(path: str, what: str, max_bytes: int) -> dict[str, Any]:
    data = parse_text(read_bounded_text(path, "model", max_bytes), ".json", "model", what)
    if not isinstance(data, dict):
        raise _problem(f"{what} is not a JSON object", "check the repository")
    return data


def _remote_code_problem(cfg: dict[str, Any], repo: str) -> ScenarioError | None:
    """A config whose model_type no adapter reads (``auto_map`` naming remote code, or a type transformers may
    know and vramplan does not): refused, naming the closest supported family; remote code is never run."""
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type in SUPPORTED_MODEL_TYPES:
        return None
    import difflib

    arch = cfg.get("architectures")
    named = model_type if isinstance(model_type, str) and model_type else (
        str(arch[0]) if isinstance(arch, list) and arch else repo.rsplit("/", 1)[-1])
    key = named.lower().removesuffix("forcausallm").replace("-", "_")
    closest = (difflib.get_close_matches(key, SUPPORTED_MODEL_TYPES, n=1, cutoff=0.0) or ["llama"])[0]
    auto_map = cfg.get("auto_map")
    remote = (f" and names only remote code (auto_map: {', '.join(sorted(map(str, auto_map)))[:200]})"
              if isinstance(auto_map, dict) and auto_map else "")
    return _problem(f"{repo}: model_type {named!r} is not supported{remote}; vramplan reads configs only through its "
                    "family adapters and never runs a repository's code (trust_remote_code)",
                    f"the closest supported family is {closest!r}; give a config.json of a supported model_type "
                    f"({len(SUPPORTED_MODEL_TYPES)} known: `vramplan models` lists the catalog)")


def _cache_file(opts: HubOptions, repo: str, commit: str) -> Path:
    # beside the hub cache, not in it: huggingface_hub's scan_cache_dir reports an unknown folder inside
    # the hub cache as a corrupted repository (utils/_cache_manager.py)
    return Path(opts.cache_dir).parent / "vramplan" / "safetensors" / f"models--{repo.replace('/', '--')}" / \
        f"{commit}.json"


def _cached_checkpoint(path: Path) -> tuple[bool, CheckpointFiles | None]:
    """(found, files) of a cached header summary; a damaged one counts as absent."""
    try:
        raw = json.loads(read_bounded_text(path, "model", MAX_DOCUMENT_BYTES))
        if not isinstance(raw, dict) or raw.get("version") != _CACHE_VERSION:
            return False, None
        if raw.get("none"):
            return True, None
        return True, CheckpointFiles(int(raw["files"]), int(raw["tensors"]), int(raw["parameters"]),
                                     int(raw["weight_bytes"]),
                                     tuple((str(k), int(v)) for k, v in dict(raw["bytes_by_dtype"]).items()),
                                     str(raw["source"]))
    except (ScenarioError, ValueError, KeyError, TypeError):
        return False, None


def _store_checkpoint(path: Path, files: CheckpointFiles | None) -> None:
    doc: dict[str, Any] = {"version": _CACHE_VERSION, "none": True} if files is None else {
        "version": _CACHE_VERSION, **files.summary()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only cache: the next run reads the headers again
        pass


def _range(url: str, headers: dict[str, str], start: int, end: int, opts: HubOptions) -> tuple[int, bytes]:
    """(status, bytes ``start``..``end``) of ``url``, streamed and cut at ``end - start + 1`` bytes: a server
    that ignores ``Range`` (200 with the whole file) costs no more than the bytes asked for."""
    from huggingface_hub import get_session

    want = end - start + 1
    buf = bytearray()
    with get_session().stream("GET", url, headers={**headers, "Range": f"bytes={start}-{end}"},
                              timeout=opts.timeout_s) as resp:
        if resp.status_code >= 400:
            return resp.status_code, b""
        skip = start if resp.status_code == 200 else 0
        for chunk in resp.iter_bytes():
            if skip:
                cut = min(skip, len(chunk))
                chunk, skip = chunk[cut:], skip - cut
            buf += chunk[: want - len(buf)]
            if len(buf) >= want:
                break
        return resp.status_code, bytes(buf)


def _header_status_problem(status: int, repo: str, filename: str, url: str) -> ScenarioError:
    if status in (401, 403):
        return _problem(f"{repo}: {url} answered {status} (a token with access is needed)", _token_hint())
    return _problem(f"{repo}: reading the safetensors header of {filename} ({url}) answered HTTP {status}",
                    "try again later, or use --offline with a cached copy, or a local config.json")


def _header(repo: str, commit: str, filename: str, opts: HubOptions) -> dict[str, Any] | None:
    """The JSON header of one safetensors file (None: the file does not exist, HTTP 404)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    url = hf_hub_url(repo, filename, revision=commit, endpoint=opts.endpoint)
    headers = build_hf_headers()
    status, first = _range(url, headers, 0, _FIRST_READ - 1, opts)
    if status == 404:
        return None
    if status >= 400:
        raise _header_status_problem(status, repo, filename, url)
    bad = f"{repo}: {filename} is not a safetensors file"
    if len(first) < 8:
        raise _problem(f"{bad} (shorter than its 8-byte header length)", "check the repository")
    n = int.from_bytes(first[:8], "little")
    if n > MAX_HEADER_BYTES or n < 2:
        raise _problem(f"{bad} (a header of {n:,} bytes; at most {MAX_HEADER_BYTES:,} are read)",
                       "check the repository")
    body = first[8:8 + n]
    if len(body) < n:
        status, rest = _range(url, headers, 8 + len(body), 8 + n - 1, opts)
        if status >= 400 and status != 416:  # 416: the file ends before the header does (cut short, below)
            raise _header_status_problem(status, repo, filename, url)
        body += rest
    if len(body) < n:
        raise _problem(f"{bad} (the header is cut short: {len(body):,} of {n:,} bytes)", "check the repository")
    try:
        header = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise _problem(f"{bad} (its header is not JSON: {str(exc)[:120]})", "check the repository") from None
    if not isinstance(header, dict):
        raise _problem(f"{bad} (its header is not a JSON object)", "check the repository")
    return header


def _tensor_sums(header: dict[str, Any], repo: str, filename: str) -> tuple[int, int, dict[str, int]]:
    """(tensors, elements, bytes by dtype) of one header; a malformed entry is refused."""
    tensors = elements = 0
    by_dtype: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        ok = isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list) \
            and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2 \
            and len(info["shape"]) <= 16 \
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**63
                    for x in (*info["shape"], *info["data_offsets"]))
        if not ok or info["data_offsets"][0] > info["data_offsets"][1]:
            raise _problem(f"{repo}: {filename} has a malformed safetensors entry {str(name)[:80]!r}",
                           "check the repository")
        numel = 1
        for d in info["shape"]:
            numel *= d
        size = info["data_offsets"][1] - info["data_offsets"][0]
        bits = _DTYPE_BITS.get(info["dtype"])
        if bits is not None and size != -(-numel * bits // 8):
            raise _problem(f"{repo}: {filename}: tensor {str(name)[:80]!r} of shape {info['shape']} in "
                           f"{info['dtype']} spans {size:,} bytes, not {-(-numel * bits // 8):,}",
                           "check the repository")
        tensors += 1
        elements += numel
        by_dtype[info["dtype"]] = by_dtype.get(info["dtype"], 0) + size
    return tensors, elements, by_dtype


def _shards(index_path: str, repo: str) -> list[str]:
    what = f"{repo}: model.safetensors.index.json"
    try:
        with open(index_path, "rb") as f:
            raw = f.read(MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:
            raise _problem(f"{what} is over {MAX_INDEX_BYTES:,} bytes", "check the repository")
        index = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise _problem(f"{what} cannot be read ({str(exc)[:120]})", "check the repository") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise _problem(f"{what} has no weight_map", "check the repository")
    files = sorted({v for v in weight_map.values() if isinstance(v, str)})
    if len(files) != len(set(weight_map.values())) or not files or len(files) > _MAX_SHARDS or \
            any(not _SHARD.match(f) or ".." in f for f in files):
        raise _problem(f"{what} names shard files that are not safetensors files of the repository",
                       "check the repository")
    return files


def _read_checkpoint(repo: str, commit: str, opts: HubOptions) -> CheckpointFiles | None:
    """The checkpoint's tensors from its safetensors headers (None: the repository has none)."""
    index = _download(repo, commit, "model.safetensors.index.json", opts, MAX_INDEX_BYTES, required=False)
    files = _shards(index, repo) if index is not None else ["model.safetensors"]
    read: Callable[[str], dict[str, Any] | None] = lambda f: _header(repo, commit, f, opts)
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
            headers = list(pool.map(read, files))
    except ScenarioError:
        raise
    except _http_error_types() as exc:
        raise _map_error(exc, repo, commit, files[0], opts) from None
    if index is None and headers[0] is None:
        return None
    if any(h is None for h in headers):
        missing = [f for f, h in zip(files, headers, strict=True) if h is None]
        raise _problem(f"{repo}: model.safetensors.index.json names {missing[0]}, which the repository lacks",
                       "check the repository")
    tensors = elements = 0
    by_dtype: dict[str, int] = {}
    for f, h in zip(files, headers, strict=True):
        assert h is not None
        t, e, b = _tensor_sums(h, repo, f)
        tensors, elements = tensors + t, elements + e
        for k, v in b.items():
            by_dtype[k] = by_dtype.get(k, 0) + v
    what = "model.safetensors.index.json and its shards" if index is not None else "model.safetensors"
    return CheckpointFiles(len(files), tensors, elements, sum(by_dtype.values()), tuple(sorted(by_dtype.items())),
                           f"safetensors headers of {what}, {opts.endpoint}/{repo} at {commit}")


def _checkpoint(repo: str, commit: str, opts: HubOptions) -> tuple[CheckpointFiles | None, list[str]]:
    cached = _cache_file(opts, repo, commit)
    found, files = _cached_checkpoint(cached)
    if found:
        return files, []
    if opts.offline:
        return None, [(f"checkpoint: the safetensors headers of {repo} at {commit} are not cached and the network is "
                      "off, so the checkpoint's tensors are not compared with the config's parameters")]
    files = _read_checkpoint(repo, commit, opts)
    _store_checkpoint(cached, files)
    return files, []


def fetch_hub_model(name: str, options: HubOptions | None = None, close: Iterable[str] = ()) -> HubModel:
    """Read ``owner/name[@revision]``'s config.json (and generation_config.json, and the safetensors headers)
    through the cache; ``close``: catalog names the offline error suggests.  Raises ``ScenarioError``."""
    parsed = parse_hub_id(name)
    if parsed is None:
        raise _problem(f"{name!r} is not a Hub id (owner/name or owner/name@revision)", "see `vramplan models`")
    repo, revision = parsed
    opts = (options or HubOptions()).resolved()
    path = _download(repo, revision, "config.json", opts, MAX_DOCUMENT_BYTES, close)
    assert path is not None
    # the cache keeps each file at snapshots/<commit>/<filename> (hf_hub_download's layout)
    snapshot = Path(path).parent.name
    commit = snapshot if re.fullmatch(r"[0-9a-f]{40}", snapshot) else revision
    config = _read_json(path, f"{repo}/config.json", MAX_DOCUMENT_BYTES)
    refused = _remote_code_problem(config, repo)
    if refused is not None:
        raise refused
    # what transformers' generate would also read; kept in the cache, none of its keys is estimated yet
    _download(repo, commit, "generation_config.json", opts, MAX_DOCUMENT_BYTES, required=False)
    checkpoint, notes = _checkpoint(repo, commit, opts)
    source = f"{opts.endpoint}/{repo} config.json at {commit}" + ("" if revision == "main" else f" ({revision})")
    return HubModel(repo, revision, commit, config, checkpoint, tuple(notes), source)


def hub_model_spec(name: str, options: HubOptions | None = None, where: str = "model",
                   close: Iterable[str] = ()) -> ModelSpec:
    """The ``ModelSpec`` of a Hub id, its checkpoint's tensors attached (``ModelSpec.checkpoint_files``)."""
    from dataclasses import replace

    hub = fetch_hub_model(name, options, close)
    spec = model_from_config(hub.config, name=hub.repo_id, where=where)
    return replace(spec, source=hub.source, checkpoint_files=hub.checkpoint, source_notes=hub.notes)


def checkpoint_notes(m: ModelSpec) -> list[str]:
    """What reading a Hub id's files could not establish, and the checkpoint's parameter count against the
    adapter's, as the report's assumptions: more than 1% apart, the difference is named instead of dropped
    silently.  A pre-quantized checkpoint packs several values in one stored element (GPTQ's int32,
    bitsandbytes' uint8), so its element count is not compared."""
    notes, c = list(m.source_notes), m.checkpoint_files
    if c is None or m.checkpoint_quant is not None or m.checkpoint_quantization is not None:
        return notes
    modelled = m.num_parameters
    diff = c.parameters - modelled
    share = diff / modelled
    if diff * 100 > modelled:
        notes.append(f"not modelled: the checkpoint holds {c.parameters:,} parameters (its safetensors headers) and "
                     f"the {m.model_type} adapter models {modelled:,} ({share:+.1%}): the tensors it does not model (a "
                     "vision tower, a projector, multi-token-prediction layers, ...) are not in the estimate")
    elif -diff * 100 > modelled:
        notes.append(f"checkpoint: the safetensors headers hold {c.parameters:,} parameters, {-share:.1%} fewer than "
                     f"the {m.model_type} adapter's {modelled:,}; the estimate uses the adapter's count")
    return notes
