"""The fleet's Redis URL forms (sandfleet/core/redis_connect.py): parsing and the broker translation."""

from __future__ import annotations

import ssl

import pytest

from sandfleet.core.queue import celery_config, redact_url
from sandfleet.core.redis_connect import (
    RedisUrlError,
    broker_options,
    check_redis_url,
    parse_sentinel_url,
    records_url,
)
from sandfleet.core.settings import Settings


def test_a_sentinel_url_names_its_sentinels_master_db_and_credentials() -> None:
    target = parse_sentinel_url(
        "sentinel://worker:s3cret@h1:26379,h2:26380/2?master=fleet&sentinel_password=sp"
    )
    assert target.sentinels == (("h1", 26379), ("h2", 26380))
    assert (target.master, target.db) == ("fleet", 2)
    assert (target.username, target.password, target.sentinel_password) == ("worker", "s3cret", "sp")


def test_a_sentinel_url_defaults_to_db_0_and_port_26379_without_credentials() -> None:
    target = parse_sentinel_url("sentinel://h1?master=m")
    assert target.sentinels == (("h1", 26379),) and target.db == 0
    assert target.username is None and target.password is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://h1:26379/0", "?master=NAME"),
        ("sentinel://h1:port/0?master=m", "is not HOST:PORT"),
        ("sentinel://h1:99999/0?master=m", "is not HOST:PORT"),
        ("sentinel://h1:1/zero?master=m", "is a number"),
        ("sentinel://h1:1/0?master=m&password=x", "unknown option 'password'"),
        ("http://h1:6379/0", "no known form"),
        ("localhost:6379", "no known form"),
    ],
)
def test_a_bad_url_is_refused_naming_the_forms(url: str, says: str) -> None:
    with pytest.raises(RedisUrlError) as caught:
        check_redis_url(url)
    assert says in str(caught.value)
    assert "sentinel://" in str(caught.value) or "?master=NAME" in str(caught.value)


def test_the_records_redis_is_the_brokers_unless_set_apart() -> None:
    assert records_url(Settings(redis_url="redis://b:1/0")) == "redis://b:1/0"
    apart = Settings(redis_url="redis://b:1/0", results_redis_url="redis://r:2/0")
    assert records_url(apart) == "redis://r:2/0"


def test_celery_gets_kombus_sentinel_form_with_the_master_name() -> None:
    settings = Settings(redis_url="sentinel://:pw@h1:1,h2:2/3?master=fleet&sentinel_password=sp")
    config = celery_config(settings)
    assert config["broker_url"] == "sentinel://:pw@h1:1/3;sentinel://:pw@h2:2/3"
    options = config["broker_transport_options"]
    assert options["master_name"] == "fleet"
    assert options["sentinel_kwargs"] == {"password": "sp"}
    assert "visibility_timeout" in options  # the shared options stay


def test_a_tls_broker_verifies_against_the_ca_file() -> None:
    options = broker_options(Settings(redis_url="rediss://h:6380/0", redis_ca_file="/etc/ca.pem"))
    assert options["broker_use_ssl"] == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/etc/ca.pem"}


def test_a_plain_broker_url_passes_unchanged() -> None:
    assert celery_config(Settings(redis_url="redis://h:1/0"))["broker_url"] == "redis://h:1/0"


def test_a_sentinel_url_is_shown_without_either_password() -> None:
    shown = redact_url("sentinel://worker:s3cret@h1:1,h2:2/0?master=m&sentinel_password=sp")
    assert "s3cret" not in shown and "sp" not in shown.partition("?")[2].replace("sentinel_password", "")
    assert shown.startswith("sentinel://worker:***@h1:1,h2:2/0?master=m")
