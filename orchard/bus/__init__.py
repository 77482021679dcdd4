"""The event bus: one small interface, an embedded on-disk log by default and Apache Kafka in production."""

from orchard.bus.base import Bus, Consumer, Delivery, Producer, Record, TopicInfo, TopicPartition, TransactionalProducer
from orchard.bus.exceptions import (
    BusError,
    BusUnavailableError,
    DeliveryError,
    RecordTooLargeError,
    TopicExistsError,
    TopicNotFoundError,
    TransactionError,
)
from orchard.bus.factory import open_bus
from orchard.bus.reading import read_until_quiet

__all__ = [
    "Bus",
    "BusError",
    "BusUnavailableError",
    "Consumer",
    "Delivery",
    "DeliveryError",
    "Producer",
    "Record",
    "RecordTooLargeError",
    "TopicExistsError",
    "TopicInfo",
    "TopicNotFoundError",
    "TopicPartition",
    "TransactionError",
    "TransactionalProducer",
    "open_bus",
    "read_until_quiet",
]
