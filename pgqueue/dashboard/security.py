"""Who may see the dashboard and who may act through it, and the CSRF check on every action.

Owns: Access (read-only unless actions are allowed; a token, basic auth, or the host
application's own check), and the CSRF token: a random value in a cookie that each form
sends back, so a page of another site cannot post an action with the operator's cookies.

Invariants: with credentials set, every page and /metrics need them, not just actions;
actions need `allow_actions` and some credential, or the app refuses to start; a POST whose
form token does not match its cookie, or whose Origin is another site's, is refused before
anything is read from the database. Comparisons take constant time.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

from pgqueue.errors import ConfigurationError

TOKEN_COOKIE = "pgqueue_dashboard_token"
CSRF_COOKIE = "pgqueue_csrf"
CSRF_FIELD = "csrf"
NEW_CSRF = "pgqueue.new_csrf"


@dataclass(frozen=True)
class Access:
    """`token`: at least 16 characters (a shorter one is refused), accepted as
    `Authorization: Bearer TOKEN` or from the login form's cookie. `basic`: (user, password)
    for HTTP basic auth. `authorize`: the host application's own check, for a dashboard
    mounted in it, called with each request."""

    allow_actions: bool = False
    token: str | None = None
    basic: tuple[str, str] | None = None
    authorize: Callable[[Request], bool] | None = None

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < 16:
            raise ConfigurationError("the dashboard token must be at least 16 characters")
        if self.allow_actions and not self.guarded:
            raise ConfigurationError(
                "actions need authentication: give a token, basic auth, or an authorize "
                "function, or leave actions off (read-only)"
            )

    @property
    def guarded(self) -> bool:
        return bool(self.token or self.basic or self.authorize)

    def allows(self, request: Request) -> bool:
        """Whether `request` may see pages (and act, if actions are on)."""
        if not self.guarded:
            return True
        if self.authorize is not None and self.authorize(request):
            return True
        if self.token_matches(_presented_token(request)):
            return True
        return self.basic is not None and _basic_matches(request, self.basic)

    def token_matches(self, given: str | None) -> bool:
        return self.token is not None and _same(given, self.token)

    def may_act(self, request: Request) -> bool:
        return self.allow_actions and self.guarded and self.allows(request)


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _presented_token(request: Request) -> str | None:
    kind, _, value = request.headers.get("authorization", "").partition(" ")
    if kind.lower() == "bearer" and value:
        return value.strip()
    return request.cookies.get(TOKEN_COOKIE)


def _basic_matches(request: Request, basic: tuple[str, str]) -> bool:
    kind, _, value = request.headers.get("authorization", "").partition(" ")
    if kind.lower() != "basic":
        return False
    try:
        user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    # Both compared, always: no early exit tells which one was wrong.
    return _same(user, basic[0]) & _same(password, basic[1])


def csrf_token(request: Request) -> str:
    """The token this browser's forms carry: its cookie's, or a new one to set."""
    found = request.cookies.get(CSRF_COOKIE)
    if found:
        return found
    # Kept in the scope, which the middleware that sets the cookie shares with the view.
    made: str = request.scope.setdefault(NEW_CSRF, secrets.token_urlsafe(32))
    return made


def csrf_valid(request: Request, form_token: object) -> bool:
    """The form's token matches the cookie, and the request does not come from another site."""
    cookie = request.cookies.get(CSRF_COOKIE)
    if not cookie or not isinstance(form_token, str) or not _same(form_token, cookie):
        return False
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")
