"""Local clients of the server (the tray, `vramgate status`) send its bearer token when one
is set: one urllib handler, installed process-wide, adds it to requests for the server's
own address only."""

from __future__ import annotations

import urllib.request

from app.config.settings import Settings


def client_token(settings: Settings) -> str | None:
    """The token a local client (the tray, `vramgate status`) sends: the configured one,
    or the server's generated one read from DATA_DIR/token when it is `auto`."""
    if settings.token is None:
        return None
    token = settings.token.get_secret_value()
    if token != "auto":
        return token
    path = settings.resolved_data_dir / "token"
    return path.read_text(encoding="utf-8").strip() if path.is_file() else None


class BearerToken(urllib.request.BaseHandler):
    def __init__(self, settings: Settings, netloc: str) -> None:
        self.settings = settings
        self.netloc = netloc

    def http_request(self, request: urllib.request.Request) -> urllib.request.Request:
        token = client_token(self.settings)  # read each time: `auto` appears at start
        if token and request.host == self.netloc:
            request.add_unredirected_header("Authorization", f"Bearer {token}")
        return request


def install(settings: Settings, url: str) -> None:
    netloc = url.split("://", 1)[-1].rstrip("/")
    urllib.request.install_opener(urllib.request.build_opener(BearerToken(settings, netloc)))
