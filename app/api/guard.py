"""The localhost guard, in front of every route (the hot ones included).

A local server is reachable from every web page the user opens. In order, before any
work: header count and size (431); the `Host` header, when bound to loopback, must name
this machine (DNS rebinding: 403 `forbidden_host`); state-changing and inference calls
from another web origin, `Origin: null` and `Sec-Fetch-Site: cross-site` are refused
(CSRF: 403 `forbidden_origin`) unless the origin is in `cors_origins`, or is one of the
desktop-app origins Ollama allows by default and the call is for Ollama's API; a
configured bearer token is required everywhere but /health and / (401), or a page's
session (app.api.page_sessions: its cookie opens the pages, and with its page key it
reads (GET) and takes the dashboard's model actions, same-origin POSTs under
/admin/models/); JSON routes take JSON only
(415: a cross-site form or `no-cors` fetch can only send text/plain, form or multipart);
and the body limit holds while the body streams in, chunked bodies included (413).
"""

from __future__ import annotations

import contextlib
import functools
import hmac
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, urlsplit

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.page_sessions import (
    PAGE_KEY_HEADER,
    PageSession,
    PageSessions,
    session_cookie,
)
from app.config.settings import Settings, is_loopback_host
from app.errors import (
    BodyTooLarge,
    ForbiddenHost,
    ForbiddenOrigin,
    HeadersTooLarge,
    Unauthorized,
    UnsupportedMediaType,
    VramgateError,
)

MAX_HEADERS = 100
MAX_HEADER_BYTES = 16 * 1024
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
JSON_ROUTES = {
    "/v1/embeddings",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/rerank",
    "/rerank",
}
PREDICT_SUFFIX = "/predict"  # POST /v1/models/{model}/predict: JSON or a multipart upload
# Answered without a token: they reveal nothing sensitive (/ is Ollama's "is it
# running", which the `ollama` CLI asks with HEAD before each command).
OPEN_ROUTES = {"/health", "/"}
PAGES = {"/dashboard", "/docs"}  # pages a browser opens: they may sign in (`_sign_in`)
KEYED_PAGES = {"/dashboard"}  # pages that take a page key (the others fetch no data)
PAGE_FILES = PAGES | {"/openapi.json"}  # what a session's cookie alone opens: no data
PAGE_ACTIONS = "/admin/models/"  # POSTs the dashboard sends with its session
OLLAMA_API = "/api/"
# Ollama's default origins (its envconfig.AllowedOrigins) for desktop and editor apps:
# Electron (app://, file://), Tauri, VS Code webviews. Web pages cannot send them (a
# browser sends `null` for a file:// page), so they open Ollama's API to those apps and
# not to web pages. Ollama's other defaults, http(s)://localhost and 127.0.0.1 on any
# port, are left out: they are every other local web server's pages.
OLLAMA_APP_ORIGINS = ("app://", "file://", "tauri://", "vscode-webview://", "vscode-file://")


async def refuse(
    send: Send, error: VramgateError, extra: list[tuple[bytes, bytes]], scope: Scope
) -> None:
    from app.api.errors import counted, error_response

    response = error_response(counted(scope, error), scope["path"])
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": [*response.raw_headers, *extra],
        }
    )
    await send({"type": "http.response.body", "body": response.body})


def host_name(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:8450" → "::1")."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@functools.lru_cache(maxsize=256)  # the same few Host values arrive again and again
def _loopback_name(host: str) -> bool:
    return is_loopback_host(host_name(host))


class RequestGuard:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.max_body = int(settings.max_body_bytes)
        self.check_host = settings.loopback
        self.hosts = {h.lower() for h in settings.allowed_hosts}
        self.origins = set(settings.cors_origins)
        token = settings.token.get_secret_value() if settings.token else None
        self.token = f"Bearer {token}".encode() if token else None
        self.sessions = PageSessions()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = scope["headers"]
        if len(raw) > MAX_HEADERS or sum(len(k) + len(v) for k, v in raw) > MAX_HEADER_BYTES:
            too_many = HeadersTooLarge("too many or too large request headers")
            await refuse(send, too_many, [], scope)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in reversed(raw)}
        origin = headers.get("origin")
        cors = origin is not None and self._cors_origin(origin, scope["path"])
        cors_headers = self._cors_headers(origin) if cors else []
        page_token = self._page_token(scope)
        try:
            self._check(scope, headers, origin, cors, page_token)
            if page_token is not None:
                await self._sign_in(scope, headers, page_token, send)
                return
        except VramgateError as error:
            await refuse(send, error, cors_headers, scope)
            return
        if scope["method"] == "OPTIONS" and cors:  # a CORS preflight from an allowed origin
            await send({"type": "http.response.start", "status": 204, "headers": cors_headers})
            await send({"type": "http.response.body", "body": b""})
            return
        declared = headers.get("content-length")
        if declared is None or not declared.isdigit():  # chunked: counted as it streams in
            receive = self._limited(receive)
        elif int(declared) > self.max_body:
            await refuse(send, BodyTooLarge(self._body_detail()), cors_headers, scope)
            return
        # else the HTTP server holds the body to its declared length: nothing to count

        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors_headers]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    def _limited(self, receive: Receive) -> Receive:
        """The body limit while the body streams in (a chunked body declares no length)."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    # FastAPI passes HTTPExceptions raised while reading the body through,
                    # so this becomes a 413 from the app's one error handler.
                    raise HTTPException(413, self._body_detail())
            return message

        return limited

    def _body_detail(self) -> str:
        return f"request body is larger than {self.max_body} bytes"

    def _check(
        self,
        scope: Scope,
        headers: dict[str, str],
        origin: str | None,
        cors: bool,
        page_token: str | None,
    ) -> None:
        host = headers.get("host")
        if self.check_host and host is not None and not self._host_ok(host):
            raise ForbiddenHost(
                "this server answers requests for localhost only; the Host header names "
                "another site (add the name to allowed_hosts if it is yours)"
            )
        path, method = scope["path"], scope["method"]
        inference = path in JSON_ROUTES or path.endswith(PREDICT_SUFFIX)
        if method not in SAFE_METHODS or inference:
            if origin is not None and not cors and not self._same_origin(origin, host):
                raise ForbiddenOrigin(
                    "calls from another web origin are refused (add it to cors_origins "
                    "if it is yours)"
                )
            if headers.get("sec-fetch-site") == "cross-site" and not cors:
                raise ForbiddenOrigin("cross-site calls from a web page are refused")
        guarded = self.token is not None and path not in OPEN_ROUTES and method != "OPTIONS"
        # The dashboard's own buttons (load, unload, pull): a POST its page sends carries
        # the page's origin, which must be this server's (checked above).
        page_action = path.startswith(PAGE_ACTIONS) and origin is not None and not cors
        if guarded and page_token is None and not self._authorised(scope, headers, page_action):
            raise Unauthorized(
                "a valid token is required (Authorization: Bearer …, or x-api-key: … as "
                "Anthropic's clients send it)"
            )
        if method == "POST" and inference:
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            is_json = kind == "application/json" or kind.endswith("+json")
            upload = kind == "multipart/form-data" and path.endswith(PREDICT_SUFFIX)
            if not (is_json or upload):
                raise UnsupportedMediaType(
                    "send the body as JSON with Content-Type: application/json"
                    + (" or as multipart/form-data" if path.endswith(PREDICT_SUFFIX) else "")
                )

    def _authorised(self, scope: Scope, headers: dict[str, str], page_action: bool) -> bool:
        """The bearer token (or the same token as `x-api-key`, Anthropic's header); or a
        page's session: its cookie alone opens the pages themselves, and with its page key
        it reads (GET) and takes the dashboard's own model actions (`page_action`). The
        cookie reaches every local web server the browser visits; the key only this
        server's own pages."""
        assert self.token is not None
        given = headers.get("authorization", "").encode("latin-1")
        if hmac.compare_digest(given, self.token):
            return True
        key = headers.get("x-api-key")
        if key is not None and hmac.compare_digest(f"Bearer {key}".encode("latin-1"), self.token):
            return True
        session = self._session(scope, headers)
        if session is None:
            return False
        reading = scope["method"] in ("GET", "HEAD")
        if reading and scope["path"] in PAGE_FILES:
            return True
        return (reading or page_action) and session.key_matches(headers.get(PAGE_KEY_HEADER))

    def _session(self, scope: Scope, headers: dict[str, str]) -> PageSession | None:
        """The live session the request's cookie names, if any."""
        cookie = SimpleCookie()
        with contextlib.suppress(CookieError):
            cookie.load(headers.get("cookie", ""))
        morsel = cookie.get(session_cookie(scope))
        return self.sessions.find(morsel.value) if morsel is not None else None

    def _page_token(self, scope: Scope) -> str | None:
        """The token in the address of `GET /dashboard?token=…` (or /docs), else None."""
        if self.token is None or scope["method"] != "GET" or scope["path"] not in PAGES:
            return None
        given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token")
        return given[0] if given else None

    async def _sign_in(
        self, scope: Scope, headers: dict[str, str], page_token: str, send: Send
    ) -> None:
        """A browser cannot send the header, so the tray opens a page once with the token
        in its address. The right token gets a 303 to the bare page, with the page key in
        its fragment (the dashboard keeps it) and, unless the browser has a live session
        already, a new session's HttpOnly, SameSite=Strict cookie; a wrong one 401."""
        assert self.token is not None
        if not hmac.compare_digest(f"Bearer {page_token}".encode(), self.token):
            raise Unauthorized("the token in the address is not this server's")
        session = self._session(scope, headers)
        answer = [(b"cache-control", b"no-store"), (b"referrer-policy", b"no-referrer")]
        if session is None:
            session = self.sessions.open()
            cookie = (
                f"{session_cookie(scope)}={session.id}; Path=/; "
                f"Max-Age={int(self.sessions.lifetime_s)}; HttpOnly; SameSite=Strict"
            )
            answer.append((b"set-cookie", cookie.encode("latin-1")))
        path = scope["path"]
        location = f"{path}#key={session.key}" if path in KEYED_PAGES else path
        answer.append((b"location", location.encode("latin-1")))
        await send({"type": "http.response.start", "status": 303, "headers": answer})
        await send({"type": "http.response.body", "body": b""})

    def _cors_origin(self, origin: str, path: str) -> bool:
        """An origin let in: a listed one, or a desktop app's to Ollama's API."""
        named = origin.lower()
        return named in self.origins or (
            path.startswith(OLLAMA_API) and named.startswith(OLLAMA_APP_ORIGINS)
        )

    def _host_ok(self, host: str) -> bool:
        return _loopback_name(host) or host_name(host).lower() in self.hosts

    def _same_origin(self, origin: str, host: str | None) -> bool:
        """A page served by this server itself (the dashboard)."""
        if origin == "null" or host is None:
            return False
        parts = urlsplit(origin)
        return (
            parts.scheme == "http"
            and parts.netloc.lower() == host.lower()
            and (self._host_ok(parts.netloc))
        )

    def _cors_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        assert origin is not None
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
            (
                b"access-control-allow-headers",
                b"authorization, content-type, x-api-key, anthropic-version, anthropic-beta",
            ),
            (b"access-control-max-age", b"600"),
            (b"vary", b"Origin"),
        ]
