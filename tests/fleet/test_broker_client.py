"""The worker's broker channel reuses one redis-py client per pool (real Redis, no worker)."""

from __future__ import annotations

from kombu import Connection

from sandfleet.worker.delivery.celery_app import POISON_SAFE_TRANSPORT


def test_the_channel_reuses_its_client_until_kombu_replaces_the_pool(redis_server: str) -> None:
    with Connection(redis_server, transport=POISON_SAFE_TRANSPORT) as connection:
        channel = connection.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert channel._create_client(asynchronous=True) is not first  # the event loop's own
        queue = connection.SimpleQueue("sandfleet-test-broker-client")
        try:  # a publish and an acknowledgement go through the reused client
            queue.put({"n": 1})
            message = queue.get(timeout=5)
            assert message.payload == {"n": 1}
            message.ack()
            assert channel._create_client() is first
        finally:
            queue.clear()
            queue.close()
        old_pool = channel.pool
        channel._pool = None  # what kombu does after a connection error: a new pool
        rebuilt = channel._create_client()
        assert rebuilt is not first
        assert rebuilt.connection_pool is channel.pool is not old_pool
