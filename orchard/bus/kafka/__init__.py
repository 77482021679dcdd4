"""The bus on Apache Kafka through confluent-kafka (librdkafka).

Producers are idempotent with ``acks=all``; keys are partitioned with murmur2 like the embedded bus (and
Kafka's Java client), so a key lands on the same partition number on either backend. Group consumers read
``read_committed``, never auto-commit, and commit only what ``poll`` has returned. Transactions follow the
exactly-once loop of confluent-kafka's ``eos_transactions`` example: offsets are sent into the transaction,
and a new producer with the same transactional id fences and aborts its dead predecessor.

Brokers fail and come back: every metadata, watermark, offsets, admin and transaction request is retried while its
error is transient (a time-out, a leader or coordinator moving) with exponential backoff, up to
``retry_timeout_s`` in all (``kafka_faults.RetryPolicy``); only then is the error raised, naming what was asked and
for how long. Topics get replication 3 and ``min.insync.replicas`` 2 on three brokers or more
(``kafka_faults.choose_replication``).
A transactional producer that hit a fatal error is replaced by a fresh one with the same id before its next
transaction (one fenced by a newer producer is not: that one has taken over). A static group member fenced by
another with the same ``group.instance.id`` raises at its next ``poll`` instead of polling nothing forever; the
error says whether another consumer took the id or this one fenced itself, rejoining after its session timed out.

Modules: ``backend`` (``KafkaBus``: connecting, topics, watermarks and offsets, making clients), ``producers``
(``KafkaProducer``, ``KafkaTransactionalProducer``), ``consumer`` (``KafkaConsumer``); the retry and replication
policy is ``orchard.bus.kafka_faults``.
"""

from orchard.bus.kafka.backend import KafkaBus
from orchard.bus.kafka.consumer import SELF_FENCE_WINDOW_S, KafkaConsumer
from orchard.bus.kafka.producers import KafkaProducer, KafkaTransactionalProducer

__all__ = ["SELF_FENCE_WINDOW_S", "KafkaBus", "KafkaConsumer", "KafkaProducer", "KafkaTransactionalProducer"]
