"""Errors raised while encoding, decoding or checking bus records.

Every decode failure is a ``SerializationError`` subclass (never a raw fastavro, ``struct`` or ``EOFError``), so a
consumer can catch one base class and send the poison record to the dead-letter topic. Library errors are chained
with ``from exc``.
"""

from orchard.exceptions import OrchardError


class SerializationError(OrchardError):
    """Base class of every codec, schema-catalog and packed-array error."""


class CorruptRecordError(SerializationError):
    """The bytes are not a well-formed record: bad marker, truncated, trailing bytes, or unreadable body."""


class UnknownFingerprintError(SerializationError):
    """The writer schema's fingerprint is not in the catalog; the message shows the fingerprint in hex."""


class IncompatibleSchemaError(SerializationError):
    """A well-formed record whose writer schema cannot be resolved to the reader schema (a catalog bug)."""


class SchemaValidationError(SerializationError):
    """A record does not match its schema; raised on encode, nothing is written."""


class UnknownSchemaError(SerializationError):
    """A schema name (or name and version) that the catalog does not hold."""


class SchemaCatalogError(SerializationError):
    """The schema directory is malformed: bad layout, unparsable schema, or a name that does not match its folder."""


class PackedArrayError(SerializationError, ValueError):
    """A packed array cannot be packed (wrong dtype, out of range) or unpacked (length not a multiple of its item)."""


class PrefixDeltaError(SerializationError):
    """A prompt cannot be rebuilt from its prefix delta (inconsistent lengths, duplicate call index)."""


class MissingBaseCallError(PrefixDeltaError):
    """A prompt refers to a base call that the reconstructor has not seen."""
