"""Cross-site request protection for the dashboard's action forms.

Three independent checks, all of which a POST must pass:

1. A token (double submit, signed): the app sets a random cookie (HttpOnly,
   SameSite=Lax, Path = the mount prefix) and every form carries
   ``HMAC-SHA256(secret, cookie)`` as ``csrf_token``. Another site can neither read the
   cookie nor compute the HMAC without the app's secret, and a cookie planted from a
   sibling subdomain is useless without its matching token. Lax, not Strict: a Strict
   cookie stays behind when a link on another site (an alert, a chat message) opens the
   dashboard, so that page set a new one, and every tab already open then had forms
   whose tokens no longer matched (403 until reloaded). A cross-site POST carries a Lax
   cookie no more than a Strict one.
2. ``Sec-Fetch-Site`` (sent by current browsers): only ``same-origin`` or ``none``.
3. ``Origin`` (when sent): its host must be the request's ``Host`` (or the proxy's
   ``X-Forwarded-Host``, which a cross-site page cannot set without a preflight).

The secret is random per app unless given: processes that serve one dashboard behind a
load balancer without a shared parent must be given the same ``csrf_secret``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from urllib.parse import urlsplit

from .http import Request

COOKIE = "alkstore_dashboard_csrf"
FIELD = "csrf_token"
_VALUE = re.compile(r"[A-Za-z0-9_-]{32,128}\Z")
_SAFE_SITES = {"same-origin", "none"}


class Csrf:
    """Issues and checks the tokens of one dashboard app."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret if secret else secrets.token_bytes(32)

    def token_for(self, cookie: str) -> str:
        return hmac.new(self.secret, cookie.encode("ascii"), hashlib.sha256).hexdigest()

    def cookie_of(self, request: Request) -> str | None:
        value = request.cookies.get(COOKIE)
        return value if value is not None and _VALUE.match(value) else None

    def issue(self, request: Request) -> tuple[str, str | None]:
        """(the token for this page's forms, a Set-Cookie value when a cookie is needed)."""
        cookie = self.cookie_of(request)
        if cookie is not None:
            return self.token_for(cookie), None
        cookie = secrets.token_urlsafe(32)
        path = request.root or "/"
        if not re.fullmatch(r"/[\x21-\x7e]*", path) or ";" in path or "," in path:
            path = "/"  # a prefix a cookie attribute cannot carry: scope it to the host
        attrs = f"{COOKIE}={cookie}; Path={path}; HttpOnly; SameSite=Lax"
        if request.scheme == "https":
            attrs += "; Secure"
        return self.token_for(cookie), attrs

    def refusal(self, request: Request) -> str | None:
        """Why this POST is refused (None: it passes every check)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site.strip().lower() not in _SAFE_SITES:
            return f"cross-site request refused (Sec-Fetch-Site: {site})"
        origin = request.headers.get("origin")
        if origin is not None and not self._same_host(origin, request):
            return "cross-site request refused (Origin does not match Host)"
        cookie = self.cookie_of(request)
        token = request.field(FIELD)
        if cookie is None or token is None:
            return "missing CSRF token: reload the page and try again"
        # compared as bytes: compare_digest refuses str with non-ASCII characters (raised: 500)
        if not hmac.compare_digest(self.token_for(cookie).encode("ascii"), token.encode("utf-8", "replace")):
            return "invalid CSRF token: reload the page and try again"
        return None

    @staticmethod
    def _same_host(origin: str, request: Request) -> bool:
        if origin.strip().lower() == "null":
            return False
        try:
            origin_host = urlsplit(origin.strip()).netloc.lower()
        except ValueError:  # not a URL (an unclosed "[" of an IPv6 host): names no host of ours
            return False
        hosts = {request.headers.get("host", "").strip().lower()}
        forwarded = request.headers.get("x-forwarded-host")
        if forwarded:
            hosts.add(forwarded.split(",")[0].strip().lower())
        return bool(origin_host) and origin_host in hosts
