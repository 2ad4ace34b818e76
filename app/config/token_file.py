"""The server's bearer token when it is `auto`: generated once into DATA_DIR/token, a
file only its owner can read, and kept there across restarts (the clients it was given
to go on working). Never logged."""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import re
import secrets
import stat
import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from app.config.settings import Settings

log = logging.getLogger("vramgate.token")
AUTO_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32), as `auto` writes it


def resolve_token(settings: Settings) -> Settings:
    """Beyond loopback a token is required; `auto` makes one, in a file only the user
    can read (DATA_DIR/token), kept across restarts (the clients it was given to go on
    working), and never logs it."""
    token = settings.token.get_secret_value() if settings.token else None
    if token is None:
        if not settings.loopback:
            raise ValueError(
                f"refusing to listen on {settings.host} without a token: anyone who can reach "
                "it could use the server; set token (or token = 'auto' to generate one)"
            )
        return settings
    if token != "auto":
        return settings
    path = settings.resolved_data_dir / "token"
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = kept_token(path)
    if kept is not None:
        owner_only(path)  # Windows: the ACL again, should the file have been copied
        log.info("using the generated token kept in %s (readable by you only)", path)
        return settings.model_copy(update={"token": SecretStr(kept)})
    token = secrets.token_urlsafe(32)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    owner_only(path)
    log.info("generated a token; it is in %s (readable by you only)", path)
    return settings.model_copy(update={"token": SecretStr(token)})


def kept_token(path: Path) -> str | None:
    """The token an earlier start generated into `path`, if it can still be trusted: a
    regular file (not a link), on POSIX owned by this user and readable by no one else,
    holding one token as `secrets.token_urlsafe(32)` writes it. Else None: a new one."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(descriptor, encoding="ascii", errors="replace") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > 1024:
            return None
        if sys.platform != "win32" and (info.st_uid != os.getuid() or info.st_mode & 0o077):
            log.warning("the token in %s was readable by others: generating a new one", path)
            return None
        token = handle.read().strip()
    return token if AUTO_TOKEN.fullmatch(token) else None


def owner_only(path: Path) -> None:
    """Windows: the file's ACL grants its owner alone, inheritance removed, wherever
    data_dir is (a folder outside the user's profile may let others read). POSIX: the
    file was created with mode 0600."""
    if sys.platform == "win32":
        subprocess.run(owner_only_command(path), check=True, capture_output=True, timeout=30)


def owner_only_command(path: Path, user: str | None = None, domain: str | None = None) -> list[str]:
    user = user or getpass.getuser()
    domain = os.environ.get("USERDOMAIN", "") if domain is None else domain
    account = f"{domain}\\{user}" if domain else user
    return ["icacls", str(path), "/inheritance:r", "/grant:r", f"{account}:F"]
