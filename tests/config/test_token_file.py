"""The `auto` token's file (app.config.token_file): kept across restarts while it can be trusted,
its owner's alone (a POSIX mode, a Windows ACL)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.config.token_file import owner_only, owner_only_command, resolve_token
from tests.support.live import make_settings


def test_the_token_file_is_its_owners_alone_on_windows_wherever_data_dir_is():
    token = Path(r"D:\vramgate-data\token")
    assert owner_only_command(token, "me", "OFFICE") == [
        "icacls", r"D:\vramgate-data\token", "/inheritance:r", "/grant:r", r"OFFICE\me:F"
    ]  # fmt: skip
    assert owner_only_command(token, "me", "")[-1] == "me:F"


@pytest.mark.skipif(sys.platform != "win32", reason="Windows ACLs")
def test_on_windows_icacls_lists_the_owner_alone(tmp_path):
    token = tmp_path / "token"
    token.write_text("x")
    owner_only(token)
    granted = subprocess.run(["icacls", str(token)], capture_output=True, text=True).stdout
    entries = [line for line in granted.splitlines()[:-2] if ":" in line]
    assert len(entries) == 1


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes and links")
def test_a_kept_auto_token_others_could_read_or_reach_through_a_link_is_replaced(tmp_path):
    settings = make_settings(tmp_path, token="auto")
    token = settings.resolved_data_dir / "token"
    first = resolve_token(settings).token.get_secret_value()
    assert resolve_token(settings).token.get_secret_value() == first  # kept
    token.chmod(0o644)  # another user may have read it: a new one, owner-only again
    second = resolve_token(settings).token.get_secret_value()
    assert second != first and token.stat().st_mode & 0o777 == 0o600
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("A" * 43 + "\n")
    elsewhere.chmod(0o600)
    token.unlink()
    token.symlink_to(elsewhere)  # the file is not read, nor written, through a link
    third = resolve_token(settings).token.get_secret_value()
    assert third not in (second, "A" * 43) and not token.is_symlink()
    assert elsewhere.read_text() == "A" * 43 + "\n"
    token.write_text("short\n")
    token.chmod(0o600)
    assert resolve_token(settings).token.get_secret_value() != "short"  # not one of ours
