"""HTTP client for the hub, used by the SDK and the CLI.

The edge where foreign exceptions stop: ``requests`` failures become ``HubUnavailable``
and problem documents become the typed ``ReachError`` the hub raised.
"""

from __future__ import annotations

import os
from typing import Any

import requests

from reach.errors import HubUnavailable, error_for_problem

DEFAULT_HUB_URL = "http://127.0.0.1:8800"


def default_hub_url() -> str:
    """Inside a handler, its agent's hub; else ``$REACH_HUB_URL``; else 127.0.0.1:8800."""
    from reach.sdk import trace

    return (trace.hub_of_current() or os.environ.get("REACH_HUB_URL") or DEFAULT_HUB_URL).rstrip(
        "/"
    )


class HubClient:
    def __init__(
        self,
        hub: str | None = None,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 10.0,
    ) -> None:
        self.base_url = (hub or default_hub_url()).rstrip("/")
        self.timeout = (connect_timeout, read_timeout)
        self._http = requests.Session()

    def close(self) -> None:
        self._http.close()

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", path, json=body)

    def get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._request("GET", path, params=params)

    def _request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        url = self.base_url + path
        try:
            resp = self._http.request(method, url, timeout=self.timeout, **kwargs)
        except requests.Timeout as exc:
            raise HubUnavailable(f"hub at {self.base_url} did not answer in time: {exc}") from exc
        except requests.RequestException as exc:
            raise HubUnavailable(f"hub at {self.base_url} is unreachable: {exc}") from exc
        if resp.status_code >= 400:
            raise error_for_problem(_json_or_empty(resp), resp.status_code)
        body = _json_or_empty(resp)
        return body


def _json_or_empty(resp: requests.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {"detail": resp.text[:500] or f"HTTP {resp.status_code}"}
    return data if isinstance(data, dict) else {"value": data}
