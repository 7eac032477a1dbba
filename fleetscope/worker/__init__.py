"""Celery: the worker runs scheduled and on-demand work; beat schedules it.

Broker: Redis in production (``FLEETSCOPE_BROKER_URL=redis://...``); the embedded default is kombu's
SQLAlchemy transport over a SQLite file in the data directory, which needs no server and survives
restarts, so ``fleetscope demo`` runs a real worker on a laptop with nothing installed.

``app`` holds the Celery app; ``tasks`` the fleet's scheduled work; ``alerting`` evaluation and delivery.
Both task modules are imported here, not only through ``include``, so that beat, which may not import
included modules, has their schedule entries.
"""

from fleetscope.worker import alerting, tasks  # noqa: F401  (registers their tasks and beat entries)
from fleetscope.worker.app import ALERTING_QUEUE, DEFAULT_QUEUE, celery_app, celery_kicker, make_celery, store

__all__ = ["ALERTING_QUEUE", "DEFAULT_QUEUE", "celery_app", "celery_kicker", "make_celery", "store"]
