"""Running a sweep's points as Ray tasks: reaching the cluster (a clear error when it cannot be
reached or the client is missing), a quiet session, and the tasks."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
from typing import Any

from sim.analysis.sweep.point import lost_result, point_task, run_point
from sim.analysis.sweep.spec import Point
from sim.engine.budget import RunBudget
from sim.errors import ConfigError

_RAY_CONNECT_ENV = {"RAY_gcs_server_port_wait_time_s": "1", "RAY_py_gcs_connect_timeout_s": "10"}
#: Seconds to wait for the head's port to accept a TCP connection before asking Ray to connect.
RAY_REACH_TIMEOUT_S = 10.0
_RAY_ADDRESS_NEEDS = (
    "the address of a running Ray cluster's head: host:port of its GCS (port 6379 by default, not the "
    "dashboard's 8265), or ray://host:10001 for Ray Client"
)


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "") or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ray_client_missing() -> str | None:
    """Why Ray Client (``ray://`` addresses) cannot be used here, or ``None``: it needs grpcio,
    which ``pip install 'ray[client]'`` adds (as Ray itself checks)."""
    try:
        import grpc  # noqa: F401
    except ImportError as exc:
        return _first_line(exc)
    return None


def _address_problem(target: str, default_port: int | None) -> str | None:
    """What is wrong with ``target``, a ``host:port`` (``default_port``: the port may be left out),
    or ``None``: an empty host (``:6379``), a missing port, a port that is no TCP port."""
    host, sep, port = target.rpartition(":")
    if not sep:
        return None if default_port is not None else f"no port: host:port, such as {target}:6379"
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address
        host = host[1:-1]
    if not host:
        return f"the host before ':{port}' is empty"
    if not port:
        return f"no port after '{host}:'"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{port!r} is not a port (an integer in 1-65535)"
    return None


@contextlib.contextmanager
def _ray_quiet():
    """Ray's Python loggers muted and file descriptor 2 held (:func:`_stderr_held`): Ray logs an
    exception with its traceback before it raises it, which kvsim reports in one line."""
    loggers = [logging.getLogger(name) for name in ("ray", "ray._private.services")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        with _stderr_held():
            yield
    finally:
        for lg, was in zip(loggers, before):
            lg.disabled = was


def _check_reachable(address: str) -> None:
    """Fail at once (one :class:`ConfigError` naming ``--address``) when the address is malformed or
    nothing can answer at it, instead of Ray's connection retries; an address Ray resolves itself
    (``auto``, a scheme other than ``ray://``) is left to ``ray.init``."""
    if "://" in address:
        scheme, _, rest = address.partition("://")
        if scheme != "ray":
            return
        target = rest.split("/", 1)[0]
        problem = _address_problem(target, 10001)
        if problem is not None:
            raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {problem}")
        missing = _ray_client_missing()
        if missing is not None:
            raise ConfigError(
                "--address",
                address,
                "a ray:// address connects through Ray Client, which needs pip install 'ray[client]' "
                f"(the kvsim cluster extra installs it; here: {missing}); or give the head's GCS "
                "address host:6379 from a machine of the cluster",
            )
        default_port = 10001
    else:
        if address.strip() not in ("auto", "local"):
            problem = _address_problem(address.strip(), None)
            if problem is not None:
                raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {problem}")
        try:
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # another Ray layout: ray.init says what is wrong
            return
        try:
            # As ray.init resolves it: 127.0.0.1 and localhost become this node's address.
            with _ray_quiet():
                target = canonicalize_bootstrap_address(address) or ""
        except Exception as exc:  # "auto" with no cluster, a malformed address
            raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {_first_line(exc)}") from None
        default_port = 6379
    host, sep, port_text = target.rpartition(":")
    if not sep:
        host, port_text = target, str(default_port)
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; {port_text!r} is not a port") from None
    if not host:
        return
    try:
        socket.create_connection((host, port), timeout=RAY_REACH_TIMEOUT_S).close()
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or _first_line(exc) or type(exc).__name__
        given = address.split("://", 1)[-1].split("/", 1)[0]
        where = (
            f"{host}:{port}" if given in (f"{host}:{port}", host) else f"{given} (which Ray resolves to {host}:{port})"
        )
        raise ConfigError("--address", address, f"{_RAY_ADDRESS_NEEDS}; nothing answers at {where} ({why})") from None


@contextlib.contextmanager
def _env(values: dict[str, str]):
    """``values`` set in ``os.environ`` where not already set, restored after."""
    added = [k for k in values if k not in os.environ]
    for k in added:
        os.environ[k] = values[k]
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def _stderr_held():
    """Hold what is written to file descriptor 2 (Ray's C++ log lines included) while connecting:
    written out after a success, dropped after a failure, which is reported in one line."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hold
        yield
        return
    held = tempfile.TemporaryFile()
    ok = False
    try:
        os.dup2(held.fileno(), 2)
        try:
            yield
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
        if ok:
            held.seek(0)
            text = held.read()
            if text:
                os.write(2, text)
    finally:
        os.close(saved)
        held.close()


class RaySession:
    """Ray for one sweep: connected (``ray.init``) before the dataset folder is touched, so that a
    bad ``--address`` fails with one line and leaves the dataset as it was; shut down when the sweep
    ends if this session started it.

    ``ray.init`` installs Ray's SIGTERM handler (and its C++ core worker a failure-signal handler
    that dumps a stack and exits 1); the caller's Python handlers of SIGINT and SIGTERM (those of
    :mod:`sim.cli.interrupts`) are put back afterwards, so that SIGTERM ends a Ray sweep as it
    ends a local one."""

    def __init__(self, address: str | None, workers: int):
        self.address = address
        self.workers = workers
        self.ray: Any = None
        self.started = False

    def connect(self) -> Any:
        if self.ray is not None:
            return self.ray
        address = self.address
        # ray reads RAY_py_gcs_connect_timeout_s when first imported: import it in here.
        with _env(_RAY_CONNECT_ENV if address is not None else {}):
            try:
                import ray
            except ImportError as exc:
                raise ConfigError("--backend", "ray", "needs ray installed: pip install 'kvsim[cluster]'") from exc
            if not ray.is_initialized():
                if address is not None:
                    _check_reachable(address)
                self._init(ray, address)
                self.started = True
        self.ray = ray
        return ray

    def _init(self, ray: Any, address: str | None) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            if address:
                with _stderr_held():
                    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            else:
                # "local": a Ray of its own, not one RAY_ADDRESS or /tmp/ray/ray_current_cluster names
                # (which num_cpus cannot be given to, nor may still be running).
                ray.init(
                    address="local",
                    num_cpus=self.workers,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                )
        except BaseException as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()  # whatever the failed init started
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
                # SIGTERM during ray.init, where Ray's handler turns it into sys.exit(15).
                on_term = handlers.get(signal.SIGTERM)
                if callable(on_term):
                    on_term(signal.SIGTERM, None)
                raise
            if not isinstance(exc, Exception):
                raise
            if address:
                raise ConfigError(
                    "--address",
                    address,
                    f"{_RAY_ADDRESS_NEEDS}; Ray could not connect: {_first_line(exc)}",
                ) from None
            raise ConfigError(
                "--backend", "ray", f"a local Ray that starts; ray.init failed: {_first_line(exc)}"
            ) from None
        finally:
            for sig, handler in handlers.items():
                if callable(handler) and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)

    def close(self) -> None:
        if self.started:
            self.started = False
            self.ray.shutdown()


def run_on_ray(session: RaySession, points: list[Point], on_result, budget: RunBudget | None = None) -> None:
    ray = session.connect()
    remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
    refs = {remote.remote(point_task(p, budget)): p for p in points}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            try:
                result = ray.get(ref)
            except Exception as exc:  # a worker or node died
                result = lost_result("ray task failed", exc)
            on_result(refs[ref], result)
