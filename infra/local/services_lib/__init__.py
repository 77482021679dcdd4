"""The parts of ``infra/local/services.py``, loaded by it as the package ``orchard_local_services_lib``: ``state``
(state directories, locks, ``ServiceError``), ``processes`` (start, find, stop), ``ports`` (port layouts and choosing
free ones), ``kafka`` (local Apache Kafka) and ``s3`` (local SeaweedFS S3). Import them through ``services.py``."""
