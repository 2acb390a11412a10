"""A model's config.json from the Hugging Face Hub, for a server started with ``--allow-hub``.

Only ``config.json`` is read (``{hub_url}/{repo_id}/resolve/{revision}/config.json``, the URL
``huggingface_hub.hf_hub_download`` builds), with a size cap and a timeout; it is data, read by the
family adapters like an uploaded file, and no code named in it (``auto_map``) is fetched or run.
Gated and private repositories answer 401/403 without a token, and the server holds none: the error
says to upload the file instead.  Off by default, so that a server answers without a network.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from vramplan.errors import Problem, ScenarioError

__all__ = ["HUB_ID", "HubSource", "fetch_config"]

# owner/name as the Hub spells repository ids (huggingface_hub.utils.validate_repo_id: letters, digits,
# "-", "_", "." in each part, at most 96 characters)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class HubSource:
    """Where config.json files are read from, and how long a read may take."""

    url: str = "https://huggingface.co"
    timeout_s: float = 10.0
    revision: str = "main"


def _problem(repo_id: str, what: str) -> ScenarioError:
    return ScenarioError([Problem("model", f"cannot read the config.json of {repo_id!r} from the Hub: {what}",
                                  "check the id, or upload the config.json")])


def fetch_config(repo_id: str, source: HubSource) -> dict[str, Any]:
    """The parsed config.json of a Hub repository, ``_name_or_path`` set to the id (a copy of the cached one)."""
    return dict(_fetch(repo_id, source))


@lru_cache(maxsize=256)
def _fetch(repo_id: str, source: HubSource) -> dict[str, Any]:
    # cached per id and source for the life of the process: a config.json at a revision does not change
    # under "main" often enough to matter for a memory estimate, and failures are not cached
    if not HUB_ID.match(repo_id) or ".." in repo_id:
        raise _problem(repo_id, "not a Hub id (owner/name)")
    url = f"{source.url.rstrip('/')}/{repo_id}/resolve/{source.revision}/config.json"
    try:
        with urllib.request.urlopen(url, timeout=source.timeout_s) as resp:
            raw = resp.read(MAX_CONFIG_BYTES + 1)
    except urllib.error.HTTPError as exc:
        what = "gated or private (the server has no token)" if exc.code in (401, 403) else f"HTTP {exc.code}"
        raise _problem(repo_id, what) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise _problem(repo_id, str(getattr(exc, "reason", exc))) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise _problem(repo_id, f"config.json is over {MAX_CONFIG_BYTES:,} bytes")
    try:
        cfg = json.loads(raw)
    except ValueError as exc:
        raise _problem(repo_id, f"config.json is not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise _problem(repo_id, "config.json is not a JSON object")
    return {**cfg, "_name_or_path": repo_id}
