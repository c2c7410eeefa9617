"""The one place that turns a Redis URL of the fleet into a client (and into Celery's broker settings).

Three forms, for the broker (``SANDFLEET_REDIS_URL``) and the records (``SANDFLEET_RESULTS_REDIS_URL``)
alike:

- ``redis://[[USER]:PASSWORD@]HOST:PORT/DB`` (and ``unix://PATH?db=N``): one server;
- ``rediss://...``: the same over TLS, the server's certificate verified against
  ``SANDFLEET_REDIS_CA_FILE`` (or the system's CAs when unset);
- ``sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/DB?master=NAME[&sentinel_password=P]``:
  the primary that the Sentinels name for ``NAME``. USER/PASSWORD authenticate to the primary (and
  replicas); ``sentinel_password`` to the Sentinels themselves (unset: they are asked without one).
  redis-py's ``Sentinel.master_for`` asks the Sentinels again after a connection error, so clients
  follow a failover by themselves; commands retry for about ``FAILOVER_RETRY_S`` meanwhile.

A URL of any other shape is refused with :class:`RedisUrlError`, which names the forms.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.settings import Settings

URL_FORMS = (
    "redis://[[USER]:PASSWORD@]HOST:PORT/DB, rediss://... (TLS, SANDFLEET_REDIS_CA_FILE) or "
    "sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/DB?master=NAME"
)
SENTINEL_DEFAULT_PORT = 26379
CONNECT_TIMEOUT_S = 5.0
# A Sentinel failover (down-after-milliseconds + election + promotion) takes seconds: commands retry
# with backoff up to 0.5 s for ~20 tries (~8 s) before the error reaches the caller.
FAILOVER_RETRIES = 20
FAILOVER_BACKOFF_CAP_S = 0.5
FAILOVER_RETRY_S = 8.0
SENTINEL_QUERY_KEYS = frozenset({"master", "sentinel_password"})


class RedisUrlError(InvalidSpecError):
    """A Redis URL of none of the fleet's forms (the message names them)."""


@dataclass(frozen=True)
class SentinelTarget:
    """What a ``sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_password: str | None = None


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The Sentinels, master name, database and credentials of ``url``, or RedisUrlError."""
    if not url.startswith("sentinel://"):
        raise RedisUrlError(f"not a sentinel:// URL; the forms are {URL_FORMS}")
    rest = url.removeprefix("sentinel://")
    rest, _, query_text = rest.partition("?")
    creds, at, hostpart = rest.rpartition("@")
    if not at:
        creds, hostpart = "", rest
    hosts, _, db_path = hostpart.partition("/")
    sentinels = tuple(_host_port(h, url) for h in hosts.split(","))
    query = {k: v[-1] for k, v in parse_qs(query_text, keep_blank_values=True).items()}
    unknown = sorted(set(query) - SENTINEL_QUERY_KEYS)
    if unknown:
        raise RedisUrlError(
            f"unknown option {unknown[0]!r} in a sentinel URL (known: master, sentinel_password): {URL_FORMS}"
        )
    if not query.get("master"):
        raise RedisUrlError(
            f"a sentinel URL needs ?master=NAME (the Sentinels' name of the primary): {URL_FORMS}"
        )
    db_text = db_path.strip("/") or "0"
    if not db_text.isdigit():
        raise RedisUrlError(f"the database of a sentinel URL is a number (/0), got {db_text!r}: {URL_FORMS}")
    user, _, password = creds.partition(":")
    return SentinelTarget(
        sentinels=sentinels,
        master=query["master"],
        db=int(db_text),
        username=unquote(user) or None,
        password=unquote(password) or None,
        sentinel_password=query.get("sentinel_password") or None,
    )


def _host_port(item: str, url: str) -> tuple[str, int]:
    host, colon, port = item.strip().rpartition(":")
    if not colon:
        host, port = item.strip(), str(SENTINEL_DEFAULT_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisUrlError(f"{item!r} is not HOST:PORT in the sentinel URL; the forms are {URL_FORMS}")
    return host, int(port)


def check_redis_url(url: str) -> str:
    """``url``'s scheme (redis, rediss, unix or sentinel), or RedisUrlError naming the forms."""
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if scheme == "sentinel":
        parse_sentinel_url(url)
    elif scheme not in ("redis", "rediss", "unix"):
        raise RedisUrlError(f"Redis URL {scheme or url[:20]!r}... is of no known form; use {URL_FORMS}")
    return scheme


def records_url(settings: Settings) -> str:
    """The Redis of records, audit, artifacts, approvals, cancels and keys: its own or the broker's."""
    return settings.results_redis_url or settings.redis_url


def connect(url: str, settings: Settings, *, decode_responses: bool = True, **options: Any) -> redis.Redis:
    """A client for ``url`` (any of the three forms); ``options`` go to redis-py (timeouts).

    Raises:
        RedisUrlError: the URL is of none of the forms. Nothing is connected before the first command.
    """
    scheme = check_redis_url(url)
    options.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
    if scheme == "sentinel":
        return _sentinel_client(parse_sentinel_url(url), decode_responses, options)
    if scheme == "rediss":
        options.update(_ssl_options(settings))
    return redis.Redis.from_url(url, decode_responses=decode_responses, **options)


def _ssl_options(settings: Settings) -> dict[str, Any]:
    """redis-py's TLS options: verify the certificate and the host name, against the CA file if set."""
    options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if settings.redis_ca_file:
        options["ssl_ca_certs"] = settings.redis_ca_file
    return options


def _sentinel_client(target: SentinelTarget, decode_responses: bool, options: dict[str, Any]) -> redis.Redis:
    sentinel_kwargs: dict[str, Any] = {"socket_connect_timeout": options["socket_connect_timeout"]}
    if target.sentinel_password:
        sentinel_kwargs["password"] = target.sentinel_password
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs, **options)  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
    retry = Retry(ExponentialBackoff(cap=FAILOVER_BACKOFF_CAP_S, base=0.05), FAILOVER_RETRIES)
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        target.master,
        redis_class=redis.Redis,
        db=target.db,
        username=target.username,
        password=target.password,
        decode_responses=decode_responses,
        retry=retry,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError],
    )
    return client


def broker_options(settings: Settings) -> dict[str, Any]:
    """Celery's ``broker_url`` and the broker options our URL forms need (kombu's own forms).

    A ``sentinel://`` URL becomes kombu's ``sentinel://H1:P1/DB;sentinel://H2:P2/DB`` with
    ``master_name`` (and ``sentinel_kwargs`` for the Sentinels' password) in the transport options;
    ``rediss://`` gets ``broker_use_ssl`` with the CA file.
    """
    url = settings.redis_url
    scheme = check_redis_url(url)
    if scheme == "rediss":
        tls: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if settings.redis_ca_file:
            tls["ssl_ca_certs"] = settings.redis_ca_file
        return {"broker_url": url, "broker_use_ssl": tls, "transport_options": {}}
    if scheme != "sentinel":
        return {"broker_url": url, "transport_options": {}}
    target = parse_sentinel_url(url)
    creds = ""
    if target.password:
        creds = f"{target.username or ''}:{target.password}@"
    urls = ";".join(f"sentinel://{creds}{host}:{port}/{target.db}" for host, port in target.sentinels)
    transport: dict[str, Any] = {"master_name": target.master}
    if target.sentinel_password:
        transport["sentinel_kwargs"] = {"password": target.sentinel_password}
    return {"broker_url": urls, "transport_options": transport}
