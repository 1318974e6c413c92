"""What a page handler works with: the request, the store, and the app's mode (read-only,
the CSRF token of this page's forms and the cookie that goes with it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..store import Store
from .html import action_form, page
from .http import Request, Response


@dataclass
class View:
    request: Request
    store: Store
    read_only: bool
    token: str = ""
    cookie: str | None = None  # a Set-Cookie value when this response must set the CSRF cookie

    def page(self, title: str, body: str, *, status: int = 200) -> Response:
        return page(self.request, title, body, status=status, cookie=self.cookie)

    def form(
        self, action: str, button: str, fields: Iterable[tuple[str, object]] = (),
        *, form_id: str | None = None, next_url: str | None = None,
    ) -> str:
        """An action form, or nothing in read-only mode (no action is ever rendered)."""
        if self.read_only:
            return ""
        return action_form(
            self.request, self.token, action, button, fields, form_id=form_id, next_url=next_url
        )
