"""The localhost guard against the attacks local servers have shipped holes for, over
real HTTP against the simulated device and simulated model: each gets its status, and
nothing is enqueued or run."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys

import httpx
import pytest
from ollama import Client

from app.config.settings import ModelSpec, SimulatedBucket
from tests.support.live import ServerProcess, clean_env

MiB = 2**20
PAGE_KEY = "X-Vramgate-Page-Key"  # what the dashboard sends with its cookie
BODY = {"model": "sim", "input": "hello"}
ROUTES = [
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/admin/pause"),
    ("POST", "/admin/models/sim/unload"),
]


def sim() -> ModelSpec:
    return ModelSpec(
        name="sim", kind="simulated", buckets=(SimulatedBucket(size=64, bytes=MiB, run_ms=1),)
    )


@pytest.fixture
def live(server_factory):
    return server_factory(device="simulated:1GiB", models=(sim(),), health_interval=3600)


def untouched(live, calls_before: int) -> None:
    status = live.status()
    assert status["queue"]["depth"] == 0 and status["pool"]["admitted_bytes"] == 0
    assert live.service.registry.get("sim").forward_calls == calls_before
    assert status["paused"] is False and status["models"][0]["state"] == "ready"


def calls(live) -> int:
    return live.service.registry.get("sim").forward_calls


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8450",
        "127.0.0.1.nip.io",
        "127.0.0.1.nip.io:8450",
        "localhost.evil.example",
        "192.168.1.20",
        "0.0.0.0",
    ],
)
def test_rebinding_host_names_are_refused_before_any_work(live, host):
    before = calls(live)
    for method, path in [*ROUTES, ("GET", "/status"), ("GET", "/v1/models")]:
        r = httpx.request(method, live.url + path, json=BODY, headers={"Host": host}, timeout=10)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "forbidden_host"
    untouched(live, before)


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "127.9.9.9:80"])
def test_loopback_host_names_are_served(live, host):
    r = httpx.post(live.url + "/v1/embeddings", json=BODY, headers={"Host": host}, timeout=10)
    assert r.status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://localhost.evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    ],
)
def test_cross_origin_calls_are_refused(live, headers):
    before = calls(live)
    for method, path in ROUTES:
        r = httpx.request(method, live.url + path, json=BODY, headers=headers, timeout=10)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "forbidden_origin"
        assert "access-control-allow-origin" not in r.headers
    untouched(live, before)


def test_same_origin_page_and_safe_reads_are_served(live):
    port = live.url.rsplit(":", 1)[1]
    r = httpx.post(
        live.url + "/v1/embeddings", json=BODY, headers={"Origin": f"http://127.0.0.1:{port}"}
    )
    assert r.status_code == 200
    r = httpx.get(live.url + "/status", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# Ollama's own default origins (its envconfig.AllowedOrigins): desktop and editor apps
# (Electron's app://, file://, Tauri, VS Code webviews), which no web page can send.
OLLAMA_APP_ORIGINS = [
    "app://obsidian.md",
    "file://",
    "tauri://localhost",
    "vscode-webview://1ab2cd3ef4",
    "vscode-file://vscode-app",
]


@pytest.mark.parametrize("origin", OLLAMA_APP_ORIGINS)
def test_desktop_and_editor_apps_reach_the_ollama_api_with_ollamas_default_origins(live, origin):
    client = Client(host=live.url, headers={"Origin": origin})  # the official client
    assert [m.model for m in client.list().models] == ["sim"]
    assert len(client.embed(model="sim", input=["a", "b"]).embeddings) == 2
    preflight = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    answered = httpx.options(live.url + "/api/chat", headers=preflight)
    assert answered.status_code == 204
    assert answered.headers["access-control-allow-origin"] == origin
    embedded = httpx.post(live.url + "/api/embed", json=BODY, headers={"Origin": origin})
    assert embedded.status_code == 200
    assert embedded.headers["access-control-allow-origin"] == origin
    # Ollama's API only: the rest of the server stays closed to them.
    before = calls(live)
    for method, path in ROUTES:
        r = httpx.request(method, live.url + path, json=BODY, headers={"Origin": origin})
        assert r.status_code == 403, (path, r.text)
    untouched(live, before)


@pytest.mark.parametrize(
    "origin",
    [
        "http://127.0.0.1:3000",  # Ollama also takes any local port: another local server
        "http://localhost:5173",
        "null",
        "https://evil.example",
        "appx://evil.example",
        "https://app.example",
        "chrome-extension://abcdefghijklmnop",
    ],
)
def test_the_ollama_api_refuses_web_pages_origins_as_before(live, origin):
    before = calls(live)
    r = httpx.post(live.url + "/api/embed", json=BODY, headers={"Origin": origin})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    preflight = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    answered = httpx.options(live.url + "/api/chat", headers=preflight)
    assert "access-control-allow-origin" not in answered.headers
    untouched(live, before)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_json_routes_refuse_bodies_a_form_could_send(live, content_type):
    before = calls(live)
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(
        live.url + "/v1/embeddings", content=b'{"model":"sim","input":"x"}', headers=headers
    )
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    untouched(live, before)


def test_cors_is_closed_by_default_and_opens_only_to_listed_origins(server_factory):
    live = server_factory(
        device="simulated:1GiB", models=(sim(),), cors_origins=("http://localhost:3000",)
    )
    preflight = {
        "Origin": "http://localhost:3000",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    r = httpx.options(live.url + "/v1/embeddings", headers=preflight)
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "access-control-allow-credentials" not in r.headers
    r = httpx.post(
        live.url + "/v1/embeddings", json=BODY, headers={"Origin": "http://localhost:3000"}
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
    r = httpx.options(live.url + "/v1/embeddings", headers={**preflight, "Origin": "http://x.io"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers


def test_wildcard_cors_origin_is_refused_at_start(server_factory):
    with pytest.raises(ValueError, match="cors origin"):
        server_factory(device="simulated:1GiB", cors_origins=("*",))


def test_token_guards_every_route_but_health_and_is_never_echoed_nor_logged(server_factory, caplog):
    caplog.set_level("INFO")
    secret = "s3cret-token-value"
    live = server_factory(device="simulated:1GiB", models=(sim(),), token=secret)
    assert httpx.get(live.url + "/health").status_code == 200
    assert secret not in httpx.get(live.url + "/health").text
    for method, path in [*ROUTES, ("GET", "/status"), ("GET", "/metrics"), ("GET", "/docs")]:
        for auth in (None, "Bearer wrong", f"Basic {secret}", f"Bearer {secret}x"):
            headers = {"Authorization": auth} if auth else {}
            r = httpx.request(method, live.url + path, json=BODY, headers=headers)
            assert r.status_code == 401, (path, auth)
            assert r.headers["www-authenticate"] == "Bearer" and secret not in r.text
    ok = httpx.post(
        live.url + "/v1/embeddings", json=BODY, headers={"Authorization": f"Bearer {secret}"}
    )
    assert ok.status_code == 200
    status = httpx.get(live.url + "/status", headers={"Authorization": f"Bearer {secret}"})
    assert secret not in status.text
    # The live test server logs through the "vramgate" loggers (no file): read them all,
    # and make sure the capture holds this test's request lines, so the check can fail.
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "request model=sim" in logged and "outcome=ok" in logged
    assert secret not in logged


def signed_in(live, secret: str) -> tuple[str, str]:
    """Sign in as the tray's address does: the session cookie (`name=value`) and the
    page key the 303 hands the page in its address's fragment (never sent to a server)."""
    signed = httpx.get(live.url + "/dashboard", params={"token": secret})
    assert signed.status_code == 303, signed.text
    key = signed.headers["location"].partition("#key=")[2]
    return signed.headers["set-cookie"].split(";", 1)[0], key


def test_a_page_signs_in_with_the_token_in_its_address_and_then_reads_and_acts_on_models(
    server_factory,
):
    secret = "s3cret; token,value"  # characters a cookie could not hold as they are
    live = server_factory(device="simulated:1GiB", models=(sim(),), token=secret)
    with httpx.Client(base_url=live.url) as browser:
        assert browser.get("/dashboard").status_code == 401
        wrong = browser.get("/dashboard", params={"token": secret + "x"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        assert browser.get("/status", params={"token": secret}).status_code == 401  # pages only
        assert not browser.cookies

        signed = browser.get("/dashboard", params={"token": secret})
        assert signed.status_code == 303 and signed.headers["location"].startswith("/dashboard#")
        key = signed.headers["location"].split("#key=", 1)[1]
        cookie = signed.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and secret not in cookie
        assert "Max-Age=" in cookie and key not in cookie and len(key) >= 32
        port = live.url.rsplit(":", 1)[1]
        assert cookie.startswith(f"vramgate_session_{port}=")  # two servers, two cookies
        page = browser.get("/dashboard")
        assert page.status_code == 200 and "<canvas" in page.text
        assert browser.get("/docs").status_code == 200
        assert browser.get("/openapi.json").status_code == 200  # what /docs itself reads
        # What the page reads takes the page key too (the dashboard sends it).
        mine = {PAGE_KEY: key}
        assert browser.get("/status").status_code == 401
        assert browser.get("/status", headers=mine).json()["state"] == "ready"
        assert browser.get("/history", headers=mine).status_code == 200
        assert browser.get("/status", headers={PAGE_KEY: key + "x"}).status_code == 401
        assert httpx.get(live.url + "/status", headers=mine).status_code == 401  # no cookie
        # Reading only: the session neither runs a model nor changes the server.
        calls = live.service.registry.get("sim").forward_calls
        assert browser.post("/v1/embeddings", json=BODY, headers=mine).status_code == 401
        assert browser.post("/admin/pause", headers=mine).status_code == 401
        assert browser.post("/admin/models/sim/unload", headers=mine).status_code == 401
        assert live.service.state.paused is False
        assert live.service.registry.get("sim").forward_calls == calls
        # The dashboard's own model buttons: a same-origin POST under /admin/models/.
        page = {"Origin": live.url, PAGE_KEY: key}
        assert browser.post("/admin/pause", headers=page).status_code == 401
        assert browser.post("/v1/embeddings", json=BODY, headers=page).status_code == 401
        other = {"Origin": "http://127.0.0.1:1", PAGE_KEY: key}  # another local server's page
        assert browser.post("/admin/models/sim/unload", headers=other).status_code == 403
        unloaded = browser.post("/admin/models/sim/unload", headers=page)
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
        # /docs signs in too, and a browser already signed in keeps its session (and key).
        again = browser.get("/docs", params={"token": secret})
        assert again.status_code == 303 and again.headers["location"] == "/docs"
        assert "set-cookie" not in again.headers
        assert browser.get("/status", headers=mine).status_code == 200

    for forged in (b"0" * 64, b"\xe9t\xe9", b"%E2%82%AC", b"a=b; c"):
        name = f"vramgate_session_{live.url.rsplit(':', 1)[1]}=".encode()
        r = httpx.get(live.url + "/dashboard", headers={b"Cookie": name + forged})
        assert r.status_code == 401, forged
    for address in ("/dashboard?token=%E2%82%AC", "/dashboard?token=%FF", "/docs?token="):
        assert httpx.get(live.url + address).status_code == 401, address


def test_a_session_cookie_another_local_server_receives_cannot_be_replayed(server_factory):
    """Browsers send 127.0.0.1's cookies to every port of it: a web server the user visits
    on another port receives the dashboard's cookie. A program replaying it forges any
    Origin; the cookie alone still opens the static pages only. It is a random id, new at
    each sign-in, and a restarted server (the same token) knows none of the old ones."""
    secret = "s3cret-token-value"
    live = server_factory(device="simulated:1GiB", models=(sim(),), token=secret)
    leaked, key = signed_in(live, secret)
    forged = {"Cookie": leaked, "Origin": live.url, "Sec-Fetch-Site": "same-origin"}
    replayed = httpx.post(live.url + "/admin/models/sim/unload", headers=forged)
    assert replayed.status_code == 401, replayed.text
    bearer = {"Authorization": f"Bearer {secret}"}
    model = httpx.get(live.url + "/status", headers=bearer).json()["models"][0]
    assert model["state"] == "ready"
    for path in ("/status", "/history", "/metrics", "/v1/models", "/api/tags"):
        assert httpx.get(live.url + path, headers=forged).status_code == 401, path
    assert httpx.get(live.url + "/dashboard", headers={"Cookie": leaked}).status_code == 200

    value = leaked.split("=", 1)[1]
    digest = hashlib.sha256(b"vramgate page session\0" + secret.encode()).hexdigest()
    assert value != digest and len(value) >= 32
    second, second_key = signed_in(live, secret)  # another browser signs in: its own
    assert second.split("=", 1)[1] != value and second_key != key

    restarted = server_factory(device="simulated:1GiB", models=(sim(),), token=secret)
    name = f"vramgate_session_{restarted.url.rsplit(':', 1)[1]}"
    old = {"Cookie": f"{name}={value}", PAGE_KEY: key}
    assert httpx.get(restarted.url + "/dashboard", headers=old).status_code == 401
    assert httpx.get(restarted.url + "/status", headers=old).status_code == 401


def test_non_loopback_bind_without_token_refuses_to_start(tmp_path):
    server = ServerProcess(
        [
            sys.executable, "-m", "app", "serve", "--host", "0.0.0.0", "--device", "simulated:1GiB",
            "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l"),
        ],
        clean_env(),
    )  # fmt: skip
    assert server.process.wait(60) == 2
    assert "without a token" in server.process.stdout.read()


def test_auto_token_is_generated_into_a_private_file_and_not_logged(tmp_path):
    server = ServerProcess(
        [
            sys.executable, "-m", "app", "serve", "--token", "auto", "--device", "simulated:1GiB",
            "--model", "sim=simulated",
            "--data-dir", str(tmp_path / "d"), "--log-dir", str(tmp_path / "l"),
        ],
        clean_env(),
    )  # fmt: skip
    try:
        token_file = tmp_path / "d" / "token"
        server.wait_ready(120)
        token = token_file.read_text().strip()
        assert len(token) >= 32 and (token_file.stat().st_mode & 0o777) == 0o600
        r = httpx.get(server.url + "/status", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
        assert httpx.get(server.url + "/status").status_code == 401
        # A local client with the same settings (`vramgate status`) sends the token.
        env = clean_env() | {
            "VRAMGATE_TOKEN": "auto",
            "VRAMGATE_DATA_DIR": str(tmp_path / "d"),
            "VRAMGATE_PORT": str(server.port),
        }
        done = subprocess.run(
            [sys.executable, "-m", "app", "status", "--json"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and json.loads(done.stdout)["ready"] is True

    finally:
        assert server.stop() == 0
    assert token not in (tmp_path / "l" / "server.log").read_text()
    assert token not in server.process.stdout.read()


def raw_request(live, head: bytes, body_chunks: list[bytes]) -> bytes:
    """Send bytes as they are; returns what came back before the server closed."""
    port = int(live.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head)
        try:
            for chunk in body_chunks:
                conn.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: what it answered is below
        data = b""
        try:
            while part := conn.recv(65536):
                data += part
                if b"\r\n\r\n" in data and data.count(b"}") >= 2:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    return data


GIB_IN_MIB_CHUNKS = [b"x" * MiB] * 1024


def test_gigabyte_body_with_honest_content_length_is_refused_unread(live):
    before = calls(live)
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1073741824\r\n\r\n"
    )
    answer = raw_request(live, head, GIB_IN_MIB_CHUNKS[:8])
    assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
    untouched(live, before)


def test_gigabyte_body_without_content_length_is_cut_off_while_streaming(live):
    before = calls(live)
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"%x\r\n" % MiB + b"x" * MiB + b"\r\n"
    answer = raw_request(live, head, [chunk] * 1024)
    assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
    untouched(live, before)


def test_gigabyte_body_with_lying_content_length_is_a_400(live):
    before = calls(live)
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    answer = raw_request(live, head, GIB_IN_MIB_CHUNKS[:16])
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    untouched(live, before)


def test_ten_thousand_headers_are_refused(live):
    before = calls(live)
    headers = {f"X-Filler-{i}": "y" for i in range(10_000)}
    try:
        r = httpx.post(live.url + "/v1/embeddings", json=BODY, headers=headers, timeout=30)
        assert r.status_code in (400, 431)
    except httpx.RemoteProtocolError:
        pass  # the HTTP parser itself dropped the connection: also refused
    untouched(live, before)


@pytest.mark.parametrize(
    "name", ["../sim", "..\\sim", "..%2Fsim", "CON", "con.txt", "\\\\server\\share\\m", "/etc/x"]
)
def test_model_names_are_names_never_paths(live, name):
    before = calls(live)
    r = httpx.post(live.url + "/v1/embeddings", json={"model": name, "input": "x"}, timeout=10)
    assert r.status_code in (400, 404)
    assert r.json()["error"]["code"] in ("invalid_request", "model_not_found")
    r = httpx.post(live.url + f"/admin/models/{name}/unload", timeout=10)
    assert 400 <= r.status_code < 500
    untouched(live, before)


def test_reserved_device_names_cannot_name_a_model():
    for name in ("CON", "nul", "COM1", "lpt9.bin"):
        with pytest.raises(ValueError, match="reserved"):
            ModelSpec(name=name, kind="simulated")


@pytest.mark.parametrize("max_tokens", [-1, 0, 2**63])
def test_max_tokens_out_of_bounds_is_a_400(live, max_tokens):
    before = calls(live)
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": max_tokens,
    }
    r = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    untouched(live, before)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages", "/v1/messages/count_tokens"])
def test_the_coding_agents_json_routes_refuse_bodies_a_form_could_send(live, path):
    """Anthropic's and OpenAI's Responses routes are JSON routes like chat's: a body a
    cross-site form or `no-cors` fetch can send (text/plain) is a 415, never parsed."""
    before = calls(live)
    body = b'{"model":"sim","input":"x","max_tokens":4,"messages":[{"role":"user","content":"x"}]}'
    r = httpx.post(live.url + path, content=body, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415, r.text
    untouched(live, before)
