"""Registry of datasets and models with their governance attributes: pure dataclasses.

The attributes follow what an audit under the GDPR and the EU AI Act asks of training data and models:

- personal data (GDPR Art. 4(1)) and the lawful basis for processing it (Art. 6(1)(a)-(f));
- special categories of personal data (Art. 9(1): racial or ethnic origin, political opinions, religious
  beliefs, trade-union membership, genetic, biometric, health, sex life or orientation), which may be
  processed only under one of the conditions of Art. 9(2)(a)-(j);
- licence and provenance of the data (AI Act Art. 10(2)(b): data collection processes and origin);
- a quarantine / prohibition flag with its reason, which propagates downstream through lineage;
- models by name and version with intended purpose (AI Act Art. 3(12)) and the organisation's role as
  provider (Art. 3(3)) or deployer (Art. 3(4)), linked to the lineage runs that trained them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LEGAL_BASES = ("consent", "contract", "legal_obligation", "vital_interests", "public_task", "legitimate_interests")
"""GDPR Art. 6(1)(a)-(f), in order."""

ART9_CONDITIONS = tuple(f"art9_2_{c}" for c in "abcdefghij")
"""GDPR Art. 9(2)(a)-(j): the exceptions under which special-category data may be processed."""

MODEL_ROLES = ("provider", "deployer", "provider_and_deployer")


@dataclass(frozen=True)
class DatasetEntry:
    """Governance attributes of one dataset, keyed like OpenLineage datasets by (namespace, name).

    Raises ``ValueError`` for contradictions a registry must not hold: special-category data that is
    not personal data, an unknown legal basis or Art. 9(2) condition, a quarantine without a reason.
    """

    namespace: str
    name: str
    license: str | None = None
    contains_personal_data: bool = False
    special_category_data: bool = False
    legal_basis: str | None = None
    art9_condition: str | None = None
    consent_reference: str | None = None
    provenance: str | None = None
    quarantined: bool = False
    quarantine_reason: str | None = None

    def __post_init__(self) -> None:
        if not self.namespace or not self.name:
            raise ValueError("a dataset needs a namespace and a name")
        if self.special_category_data and not self.contains_personal_data:
            raise ValueError(f"{self.node_id}: special-category data (GDPR Art. 9) is personal data; set contains_personal_data")
        if self.legal_basis is not None and self.legal_basis not in LEGAL_BASES:
            raise ValueError(f"{self.node_id}: legal_basis {self.legal_basis!r} is not one of {', '.join(LEGAL_BASES)} (GDPR Art. 6(1))")
        if self.art9_condition is not None and self.art9_condition not in ART9_CONDITIONS:
            raise ValueError(f"{self.node_id}: art9_condition {self.art9_condition!r} is not one of art9_2_a..art9_2_j (GDPR Art. 9(2))")
        if self.quarantined and not (self.quarantine_reason or "").strip():
            raise ValueError(f"{self.node_id}: a quarantined dataset needs a reason")

    @property
    def node_id(self) -> str:
        return f"dataset:{self.namespace}:{self.name}"

    def issues(self) -> list[str]:
        """What an auditor would flag on this entry alone (the AI Act rules read these)."""
        out = []
        if self.contains_personal_data and self.legal_basis is None:
            out.append("personal data without a recorded legal basis (GDPR Art. 6(1))")
        if self.legal_basis == "consent" and not self.consent_reference:
            out.append("legal basis is consent but no consent record is referenced (GDPR Art. 7(1))")
        if self.special_category_data and self.art9_condition is None:
            out.append("special-category data without an Art. 9(2) condition: processing is prohibited (GDPR Art. 9(1))")
        if self.license is None:
            out.append("no licence recorded")
        if self.provenance is None:
            out.append("no provenance recorded (AI Act Art. 10(2)(b))")
        return out


@dataclass(frozen=True)
class ModelEntry:
    """A model version, its purpose and role, and the lineage runs that trained it."""

    name: str
    version: str
    intended_purpose: str = ""
    role: str = "provider"
    training_run_ids: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.name or not self.version:
            raise ValueError("a model needs a name and a version")
        if self.role not in MODEL_ROLES:
            raise ValueError(f"model {self.name}:{self.version}: role {self.role!r} is not one of {', '.join(MODEL_ROLES)} (AI Act Art. 3(3), 3(4))")

    @property
    def node_id(self) -> str:
        return f"model:{self.name}:{self.version}"
