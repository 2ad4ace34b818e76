"""The tray process (what a double-click runs): single instance, supervisor, monitor,
and the pystray icon on the main thread. Never imports torch, the engines or the core;
talks to the server over HTTP only."""

from __future__ import annotations

import contextlib
import functools
import logging
import logging.handlers
import signal
import sys
import threading
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.config import client_auth
from app.config.settings import Settings, config_path, load_settings
from app.errors import EXIT_INVALID_SETTINGS, EXIT_PORT_IN_USE
from app.process import streams
from app.process.ports import port_free
from tray import single_instance
from tray.autostart import Autostart, tray_command
from tray.icon import render
from tray.icon_thread import updates_for
from tray.menu import Item, TrayActions, build_menu, page_url
from tray.messages import port_taken_text, tell
from tray.monitor import Monitor
from tray.session_end import stop_at_session_end
from tray.supervisor import Supervisor, server_command
from tray.view import TrayView, view_of

log = logging.getLogger("vramgate.tray")
QUIT_AFTER_PORT_CONFLICT_S = 5.0


def configure_tray_logging(log_dir: Path) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [
        logging.handlers.RotatingFileHandler(
            log_dir / "tray.log", maxBytes=5 * 2**20, backupCount=3, encoding="utf-8"
        )
    ]
    if sys.stderr is not None and not streams.replaced:  # none in a windowed executable
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.INFO,
        handlers=handlers,
        force=True,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )


def server_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}"


def to_pystray(items: tuple[Item, ...]) -> list[Any]:
    import pystray

    converted: list[Any] = []
    for item in items:
        if item.separator:
            converted.append(pystray.Menu.SEPARATOR)
            continue
        if item.submenu:
            action: Any = pystray.Menu(*to_pystray(item.submenu))
        else:
            act = item.action

            def action(icon: Any, _item: Any, act: Any = act) -> None:
                if act is not None:
                    act(icon)

        checked = None if item.checked is None else (lambda _i, v=item.checked: v)
        converted.append(
            pystray.MenuItem(
                item.text,
                action,
                checked=checked,
                enabled=item.enabled,
                default=item.text == "Open dashboard",
            )
        )
    return converted


def menu_shows(view: TrayView) -> tuple[object, ...]:
    """What the menu shows of a view (its status lines, model lines and the pause check);
    the menu is rebuilt only when this changes."""
    return (view.lines, view.models, view.paused)


class Tray:
    def __init__(
        self,
        url: str,
        supervisor: Supervisor,
        log_dir: Path,
        token: Callable[[], str | None] = lambda: None,
        autostart: Autostart | None = None,
    ) -> None:
        import pystray

        from tray.xorg_icon import icon_class

        self.supervisor = supervisor
        self.exit_code = 0
        self.view = view_of(None)
        self.actions = TrayActions(url, supervisor, log_dir, token=token, autostart=autostart)
        self.icon = icon_class(pystray.Icon)(
            "vramgate",
            render(self.view.icon),
            self.view.tooltip,
            menu=pystray.Menu(lambda: to_pystray(build_menu(self.view, self.actions))),
        )
        self.on_icon_thread = updates_for(self.icon)
        stop_at_session_end(self.icon, supervisor.stop)  # Windows' sign-out and shutdown
        self.monitor = Monitor(url, supervisor, self.show, token=token)
        supervisor.before_end = self.monitor.end_connection  # our connections close first

    def show(self, view: TrayView, previous: TrayView | None) -> None:
        """Redraw only what changed, on the icon's own thread (called from the monitor's)."""
        new = previous is None
        image = render(view.icon) if new or view.icon != previous.icon else None
        title = view.tooltip if new or view.tooltip != previous.tooltip else None
        menu = new or menu_shows(view) != menu_shows(previous)
        notice = view.notice
        if notice is not None and not new and previous.notice == notice:
            notice = None

        def apply() -> None:
            self.view = view  # read by the menu's builder, on this thread
            if image is not None:
                self.icon.icon = image
            if title is not None:
                self.icon.title = title
            if menu:
                self.icon.update_menu()
            if notice is not None:
                log.info("%s", notice.text)
                with contextlib.suppress(NotImplementedError):  # not every backend notifies
                    self.icon.notify(notice.text)

        if image is not None or title is not None or menu or notice is not None:
            self.on_icon_thread(apply)
        if self.supervisor.state == "gave_up" and self.supervisor.last_exit == EXIT_PORT_IN_USE:
            self._quit_after_port_conflict()

    def _quit_after_port_conflict(self) -> None:
        if self.exit_code:
            return
        self.exit_code = EXIT_PORT_IN_USE
        log.error("the server's port is in use by another program; vramgate stops")
        tell("vramgate", "The port is in use by another program; vramgate stops.", self.icon)
        threading.Timer(QUIT_AFTER_PORT_CONFLICT_S, self.icon.stop).start()

    def run(self) -> int:
        def setup(icon: Any) -> None:
            icon.visible = True
            self.supervisor.start()
            self.monitor.start()

        for sig in (signal.SIGINT, signal.SIGTERM):  # a stop signal is a Quit
            signal.signal(sig, lambda *_: self.icon.stop())
        self.icon.run(setup=setup)
        self.monitor.stop()
        self.supervisor.stop()
        return self.exit_code


def run_tray(config_file: Path | None = None) -> int:
    try:
        settings = load_settings({}, config_file)
    except ValueError as exc:  # a bad config: say so where the person looks, and why
        log_dir = Settings.model_construct().resolved_log_dir
        configure_tray_logging(log_dir)
        where = config_file or config_path()
        log.error("vramgate cannot start: the config %s is invalid: %s", where, exc)
        text = f"vramgate cannot start: {where} is invalid.\n\n{exc}\n\nDetails: {log_dir}"
        tell("vramgate", text)
        return EXIT_INVALID_SETTINGS
    configure_tray_logging(settings.resolved_log_dir)
    lock = single_instance.acquire(settings.resolved_data_dir)
    if lock is None:  # a second double-click: show the running one (no console to tell)
        log.info("vramgate is already running; opening its dashboard")
        token = client_auth.client_token(settings)
        webbrowser.open(page_url(server_url(settings), "/dashboard", token))
        return 0
    if not port_free(settings.host, settings.port):
        log.error(
            "port %d on %s is already in use by another program; set another port "
            "(port = ... in %s) or stop that program",
            settings.port,
            settings.host,
            config_file or "the config file",
        )
        where = config_file or config_path()
        tell("vramgate", port_taken_text(settings.host, settings.port, where))
        return EXIT_PORT_IN_USE
    url = server_url(settings)
    client_auth.install(settings, url)
    supervisor = Supervisor(
        server_command(config_file),
        log_dir=settings.resolved_log_dir,
        pid_file=settings.resolved_data_dir / "server.pid",
        shutdown_url=url + "/admin/shutdown",
    )
    # start at login runs this tray with this config; an entry left pointing at a moved
    # or deleted copy, or at another config of this one, is written again
    autostart = Autostart(tray_command(config_file=config_file))
    autostart.repair()
    try:
        token = functools.partial(client_auth.client_token, settings)
        return Tray(url, supervisor, settings.resolved_log_dir, token, autostart).run()
    finally:
        lock.release()
