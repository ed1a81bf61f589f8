"""Who may call the server's endpoints: the cross-site checks of the speech endpoints and the admin
endpoints' checks (Host, Origin, bearer token or loopback client, JSON body) (serve.app calls them)."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

from chattts_forge.errors import quote
from chattts_forge.runtime.serve.config import ServeConfig
from chattts_forge.runtime.serve.refusals import AdminRefused, CrossOrigin, NotJson
from chattts_forge.runtime.serve.requests import BadRequest


def check_cross_site(request: Any, cfg: ServeConfig) -> None:
    """Refuse a speech request from a web page of another site (an `Origin` not allowed by
    --cors-origin), or a body that is not declared JSON (a page may POST text/plain cross-site
    without a CORS preflight)."""
    origin = request.headers.get("origin")
    if origin is not None and not origin_allowed(origin, cfg.cors_origins):
        raise CrossOrigin(f"cross-origin requests are refused (Origin {quote(origin)}); a web app's origin may be "
                          "allowed with --cors-origin")
    ctype = media_type(request)
    if ctype != "application/json":
        raise NotJson(f"the speech endpoints take Content-Type: application/json, not {quote(ctype or 'none')}")


def check_admin(request: Any, cfg: ServeConfig) -> None:
    """Refuse (AdminRefused) a request that may not use /admin/*: a foreign Host (DNS rebinding) or
    Origin (a web page), no bearer token (or a loopback client, with `admin_loopback`), not JSON."""
    host = request.headers.get("host", "")
    if not _known_host(host, cfg):
        raise AdminRefused(403, f"admin endpoints answer only the Host names this server is known by (localhost, "
                                f"an IP address, --host, --admin-host), not {quote(host)}")
    origin = request.headers.get("origin")
    if origin is not None and _origin_netloc(origin) != host.lower():
        raise AdminRefused(403, f"admin endpoints refuse cross-origin requests (Origin {quote(origin)})")
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    client = request.client.host if request.client else ""
    # the scheme is case-insensitive (RFC 7235 2.1); the token is compared in constant time
    if cfg.admin_token and scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                                cfg.admin_token.encode()):
        pass
    elif cfg.admin_loopback and _is_loopback(client):
        pass
    elif cfg.admin_token:
        raise AdminRefused(401, "admin endpoints need Authorization: Bearer <token> (--admin-token, or the token "
                                "file whose path the server logged at start)")
    else:
        raise AdminRefused(403, "admin endpoints answer loopback clients only (--admin-loopback); others need "
                                "--admin-token")
    ctype = media_type(request)
    if ctype != "application/json":
        raise AdminRefused(415, f"admin endpoints take Content-Type: application/json, not {quote(ctype or 'none')}")


def reload_path(body: dict[str, Any]) -> str:
    """The folder a reload body names: `artifact`, required (an empty body never reloads)."""
    unknown = sorted(set(body) - {"artifact"})
    if unknown:
        raise BadRequest(f"unknown field {quote(unknown[0])} in the reload body (known: artifact)")
    path = body.get("artifact")
    if not isinstance(path, str) or not path:
        raise BadRequest("/admin/reload needs {\"artifact\": \"a version or artifact folder\"}", "artifact")
    return path


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """The name of a Host header (`[::1]:8000` -> `::1`, `Example:80` -> `example`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _known_host(host: str, cfg: ServeConfig) -> bool:
    """A Host header naming this server: localhost, an IP literal (a rebound DNS name is neither),
    the --host it listens on, or an --admin-host. Not Starlette's TrustedHostMiddleware: it guards every
    route (not /admin/* only) with a plain-text 400 (ours: a JSON 403), and has no "any IP literal"."""
    name = _host_name(host)
    if not name:
        return False
    if name == "localhost" or name == cfg.host.lower() or name in {h.lower() for h in cfg.admin_hosts}:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def media_type(request: Any) -> str:
    """The media type of a request's Content-Type, lowercase, without its parameters ("" when none)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def origin_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    """Whether a request's `Origin` is one --cors-origin lists (`*`: any)."""
    return "*" in allowed or origin.strip().lower().rstrip("/") in allowed


def _origin_netloc(origin: str) -> str:
    """`scheme://host:port` of an Origin header -> `host:port` ("null" and others -> "")."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return rest.rstrip("/") if sep and scheme in ("http", "https") else ""
