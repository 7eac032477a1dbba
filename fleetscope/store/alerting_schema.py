"""Alerting tables, registered on ``fleetscope.store.schema.metadata`` so Alembic migrates them with the rest.

State is durable so that a restart of the API, a worker or beat loses no firing alert and sends no
duplicate (issue 9): alert states and notification groups are written in the same transaction as the
outbox rows their evaluation produced.
"""

from __future__ import annotations

from sqlalchemy import Column, Double, ForeignKey, Index, Integer, String, Table, Text

from fleetscope.store.sqltypes import UTCDateTime, metadata

alert_rule = Table(
    "alert_rule",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("spec_json", Text, nullable=True, comment="the rule document; NULL deletes the file rule of this name"),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("updated_by", String(200), nullable=True),
    comment="Rules set through the admin API, layered over the rules file.",
)

alert_state = Table(
    "alert_state",
    metadata,
    Column("fingerprint", String(16), primary_key=True),
    Column("rule", String(200), nullable=False),
    Column("state", String(10), nullable=False, comment="pending, firing or inactive (resolved)"),
    Column("labels_json", Text, nullable=False),
    Column("annotations_json", Text, nullable=False),
    Column("active_at", UTCDateTime(), nullable=False),
    Column("last_active_at", UTCDateTime(), nullable=False),
    Column("fired_at", UTCDateTime(), nullable=True),
    Column("resolved_at", UTCDateTime(), nullable=True),
    Column("value", Double, nullable=True),
    Index(None, "rule"),
    Index(None, "state"),
    comment="Each alert the rules hold, by the fingerprint of its label set.",
)

alert_group = Table(
    "alert_group",
    metadata,
    Column("group_hash", String(64), primary_key=True, comment="sha256 of the group id (route id + group labels)"),
    Column("group_key", Text, nullable=False),
    Column("receiver", String(200), nullable=False),
    Column("next_flush_at", UTCDateTime(), nullable=True),
    Column("state_json", Text, nullable=False, comment="alerts and the last notification (Alertmanager's nflog entry)"),
    comment="Notification aggregation groups and what each last told its receiver.",
)

alert_receiver = Table(
    "alert_receiver",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("kind", String(32), nullable=False, comment="webhook, alertmanager, slack or standard"),
    Column("url_encrypted", Text, nullable=False, comment="Fernet token: a Slack URL is itself a secret"),
    Column("url_display", Text, nullable=False, comment="scheme and host only"),
    Column("secrets_encrypted", Text, nullable=True, comment="Fernet token of a JSON list of whsec_ secrets"),
    Column("options_json", Text, nullable=False, server_default="{}"),
    Column("disabled_at", UTCDateTime(), nullable=True),
    Column("disabled_reason", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

alert_notification = Table(
    "alert_notification",
    metadata,
    Column("notification_id", Integer, primary_key=True, autoincrement=True),
    Column("webhook_id", String(64), nullable=False, unique=True, comment="idempotency key, the same on every retry"),
    Column("receiver", String(200), nullable=False),
    Column("group_key", Text, nullable=False),
    Column("status", String(16), nullable=False, comment="pending, delivered, dead or disabled"),
    Column("payload_json", Text, nullable=False, comment="Alertmanager template data; each notifier renders its own body"),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("next_attempt_at", UTCDateTime(), nullable=True),
    Column("lease_until", UTCDateTime(), nullable=True, comment="a worker holds the delivery until then; after it, another may"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("delivered_at", UTCDateTime(), nullable=True),
    Column("last_status_code", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Index(None, "status", "next_attempt_at"),
    Index(None, "receiver", "status"),
    comment="The outbox: one row per notification and receiver; the dead letters are those with status dead.",
)

alert_delivery_attempt = Table(
    "alert_delivery_attempt",
    metadata,
    Column("attempt_id", Integer, primary_key=True, autoincrement=True),
    Column("notification_id", Integer, ForeignKey("alert_notification.notification_id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Column("duration_s", Double, nullable=True),
    Column("status_code", Integer, nullable=True),
    Column("outcome", String(16), nullable=False, comment="delivered, retry, dead or disabled"),
    Column("error", Text, nullable=True),
    Index(None, "notification_id"),
    comment="Every delivery attempt, for the audit trail and the dashboard.",
)

alert_silence = Table(
    "alert_silence",
    metadata,
    Column("silence_id", String(36), primary_key=True),
    Column("matchers_json", Text, nullable=False),
    Column("starts_at", UTCDateTime(), nullable=False),
    Column("ends_at", UTCDateTime(), nullable=False),
    Column("created_by", String(200), nullable=False),
    Column("comment", Text, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index(None, "ends_at"),
)

alert_lock = Table(
    "alert_lock",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(200), nullable=True),
    Column("at", UTCDateTime(), nullable=True),
    comment="A row updated first in each evaluation transaction, so evaluations never overlap.",
)
