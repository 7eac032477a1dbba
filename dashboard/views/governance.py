"""Governance: models and their risk class, a model's lineage, fairness by group, post-market monitoring
over time (drift, accuracy, fairness with intervals, the impossibility view), the EU AI Act rule matrix
with evidence, and the audit reports and signed export bundles to download (or a new export).

Reports and bundles are the files the audit service filed (``fleetscope.services.audit``, as the API's
``/api/v1/audits/{id}/report.{fmt}`` and ``/api/v1/exports/{id}`` serve them): a report whose file no
longer matches the hash recorded when it was made is refused, not offered.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import altair as alt
import polars as pl
import streamlit as st

from dashboard import signin, ui
from fleetscope.services import audit as au
from fleetscope.services import audit as audit_svc
from fleetscope.services import governance as governance_svc
from fleetscope.services import monitoring as monitoring_svc
from fleetscope.core.errors import NotFound
from governance.aiact import checks
from governance.aiact.model import INCIDENT_KINDS, DeclarationError
from governance.fairness import FairnessInputError
from fleetscope import settings as settings_mod

ui.require("governance")
st.title("Governance")
settings = settings_mod.load()
MEDIA = {"json": "application/json", "html": "text/html", "pdf": "application/pdf"}
STATUS_COLORS = alt.Scale(domain=["pass", "fail", "missing_evidence", "not_applicable"], range=["#2e7d32", "#c62828", "#f9a825", "#bdbdbd"])

audits = ui.q(audit_svc.audit_runs, fresh=True)  # small, and this page can add exports to it


def report_file(audit_id: str, fmt: str) -> tuple[bytes | None, str | None]:
    """A filed report's bytes, or None and why (file moved, or changed since it was hashed)."""
    try:
        return au.report_file(ui.store(), settings, audit_id, fmt)[0], None
    except (au.AuditError, OSError) as exc:
        return None, str(exc)


@st.cache_data(ttl=ui.HISTORY_TTL_S, show_spinner=False)
def classification(url: str, data_dir: str, audit_id: str) -> dict[str, dict[str, Any]]:
    """Each model's risk class as the audit decided it, from its JSON report (model:version → classification, counts)."""
    data, _ = report_file(audit_id, "json")
    if data is None:
        return {}
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    return {f"{m['model_name']}:{m['model_version']}": {"classification": m.get("classification") or {}, "counts": m.get("counts") or {}}
            for m in doc.get("models", [])}


def _dataset_of(node_id: str) -> dict[str, str]:
    """A lineage node id ``dataset:<namespace>:<name>`` as the dataset's name and namespace, as an auditor
    reads them (the namespace may hold colons itself: ``s3://bucket``)."""
    kind, _, rest = node_id.partition(":")
    namespace, _, name = rest.rpartition(":")
    return {"dataset": name, "namespace": namespace} if kind == "dataset" and name else {"dataset": node_id, "namespace": ""}


# --- models -----------------------------------------------------------------------------------------

st.subheader("Models and risk class")
models = ui.q(governance_svc.models, fresh=True)
latest = audits.row(0, named=True) if audits.height else None
if models.is_empty():
    ui.no_data("no models registered.", "Register one with `PUT /api/v1/models/{name}/{version}`; OpenLineage training runs link it to its data.")
else:
    classes = classification(ui.database_url(), str(settings.data_dir), latest["audit_id"]) if latest else {}

    def risk(key: str) -> tuple[str | None, str | None]:
        c = (classes.get(key) or {}).get("classification") or {}
        known = ", ".join(c.get("classes") or []) or None
        unknown = ", ".join(c.get("unknown") or [])
        return known or (f"undecided ({unknown} not declared)" if unknown else None), "; ".join(c.get("reasons") or []) or None

    keys = [f"{a}:{b}" for a, b in models.select("model_name", "model_version").rows()]
    shown = models.with_columns(
        risk_class=pl.Series([risk(k)[0] for k in keys], dtype=pl.String),
        why=pl.Series([risk(k)[1] for k in keys], dtype=pl.String),
        rules_failed=pl.Series([(classes.get(k) or {}).get("counts", {}).get("fail") for k in keys], dtype=pl.Int64),
        rules_missing_evidence=pl.Series([(classes.get(k) or {}).get("counts", {}).get("missing_evidence") for k in keys], dtype=pl.Int64),
    )
    st.dataframe(shown.select("model_name", "model_version", "risk_class", "why", "rules_failed", "rules_missing_evidence", "intended_purpose", "role"), hide_index=True)
    if latest:
        st.caption(f"Risk class as the latest audit ({latest['audit_id']}, {latest['as_of']:%Y-%m-%d %H:%M} UTC) decided it from the declarations.")
    else:
        st.caption("No audit has run yet: the risk class is decided by the AI Act rules when one does.")

# --- lineage ----------------------------------------------------------------------------------------

st.subheader("Lineage")
if models.is_empty():
    ui.no_data("no model to trace.", "OpenLineage events (`/api/v1/lineage`) build the graph of which data trained which model.")
else:
    # models with training runs first: theirs is the lineage there is to show (a deployed-only model has none)
    trained = {f"{m.name}:{m.version}" for m in ui.q(governance_svc.registry, live=False)[1] if m.training_run_ids}
    pick = st.selectbox("Model", sorted(keys, key=lambda k: k not in trained), key="gov_lineage_model")
    name, version = pick.rsplit(":", 1)
    lineage = ui.q(governance_svc.registered_model_lineage, live=False, model_name=name, model_version=version)
    upstream = (lineage or {}).get("upstream") or []
    if not upstream:
        ui.no_data(f"no lineage reaches {pick}.", "Training runs link a model to its data through OpenLineage events with the fleetscope_model facet, or the registry's training_run_ids.")
    else:
        tainted = {t["source"] for t in lineage.get("taints") or []}
        edges, nodes = set(), {}
        for u in upstream:
            path = u["path"]
            for a, b in zip(path, path[1:]):
                edges.add((a["id"], b["id"]))
            for n in path:
                nodes[n["id"]] = n
        shape = {"dataset": "box", "run": "ellipse", "model": "doubleoctagon"}

        def label(n: dict[str, Any]) -> str:
            text = n["label"].split(" (job ")[-1].rstrip(")") if n["kind"] == "run" else n["id"].split(":", 1)[1]
            return text.replace('"', "'")

        dot = ["digraph lineage {", "rankdir=LR;", 'node [fontsize=10, fontname="Helvetica"];']
        for nid, n in nodes.items():
            color = ', style=filled, fillcolor="#ffcdd2"' if nid in tainted else ""
            dot.append(f'"{nid}" [label="{label(n)}", shape={shape.get(n["kind"], "box")}{color}];')
        dot += [f'"{a}" -> "{b}";' for a, b in sorted(edges)]
        dot.append("}")
        st.graphviz_chart("\n".join(dot))
        st.caption(f"{len(upstream)} upstream datasets of {pick}; red: a dataset whose flags (quarantine, personal data, licence) reach the model.")
        if lineage.get("taints"):
            st.dataframe(pl.DataFrame([{"kind": t["kind"], **_dataset_of(t["source"]), "detail": t.get("detail")} for t in lineage["taints"]]), hide_index=True)

# --- fairness ---------------------------------------------------------------------------------------

st.subheader("Fairness by group")
fair = ui.q(governance_svc.fairness_groups, live=False)
if fair.is_empty():
    ui.no_data("no fairness evaluations.", "Upload a model's predictions with `POST /api/v1/models/{name}/fairness`: metrics by group with bootstrap confidence intervals.")
else:
    # every evaluated model's verdict at a glance; the chart below shows one model's groups
    st.dataframe(fair.unique("model", keep="first", maintain_order=True).select("model", "evaluated_at", "passed", "confidence"), hide_index=True)
    c1, c2 = st.columns(2)
    fmodel = c1.selectbox("Model evaluated", fair["model"].unique(maintain_order=True).to_list(), key="gov_fair_model")
    metric = c2.selectbox("Metric", ["fnr", "fpr", "tpr", "selection_rate", "accuracy", "ppv"], key="gov_fair_metric",
                          help="fnr: false-negative rate (missed positives); fpr: false-positive rate; selection_rate: share predicted positive")
    rows = fair.filter((pl.col("model") == fmodel) & (pl.col("metric") == metric)).with_columns(
        label=pl.format("{}: {}", "feature", "group"))
    head = rows.row(0, named=True)
    st.caption(f"Evaluated {head['evaluated_at']:%Y-%m-%d %H:%M} UTC; policy {'passed' if head['passed'] else 'FAILED'}; "
               f"bars are {head['confidence'] or 0.95:.0%} bootstrap confidence intervals.")
    base = alt.Chart(rows).encode(y=alt.Y("label:N", title="Group", sort=None), color=alt.Color("feature:N", title="Feature", legend=None))
    ui.chart(
        alt.layer(
            base.mark_rule(strokeWidth=2).encode(x=alt.X("ci_low:Q", title=f"{metric} (ratio)"), x2="ci_high:Q"),
            base.mark_point(filled=True, size=60).encode(x="value:Q", tooltip=["feature", "group", "count", alt.Tooltip("value:Q", format=".3f"),
                                                                                alt.Tooltip("ci_low:Q", format=".3f"), alt.Tooltip("ci_high:Q", format=".3f")]),
        ),
        height=max(120, 28 * rows.height),
    )

# --- post-market monitoring -------------------------------------------------------------------------


def declare_incident() -> None:
    """The incident form's callback: declare through the audit service under the signed-in name."""
    picked = st.session_state.get("gov_incident_finding")
    kind = st.session_state.get("gov_incident_kind")
    actor = signin.acting("declare_incident")
    if actor is None:
        ui.tell("gov_incident_result", False, "No incident was declared: declaring one needs the governance scope, and this session no longer holds it.")
        return
    if not picked or not kind:
        ui.tell("gov_incident_result", False, "No incident was declared: pick a finding and the kind of incident.")
        return
    f_kind, subject, ws = json.loads(picked)
    try:
        d = au.declare_incident(ui.store(), f_kind, subject, dt.datetime.fromisoformat(ws), incident_kind=kind, entered_by=actor.name)
    except (NotFound, DeclarationError, ValueError) as exc:
        ui.tell("gov_incident_result", False, f"No incident was declared: {exc}")
        return
    days = checks.incident_deadline(kind)
    due = dt.datetime.fromisoformat(str(d.value["aware_at"]).replace("Z", "+00:00")) + dt.timedelta(days=days)
    ui.tell("gov_incident_result", True, f"Serious incident declared for {d.model_name}@{d.model_version} by {actor.name}: report it to the "
                                         f"market surveillance authority by {due:%Y-%m-%d %H:%M} UTC ({days} days, {checks.incident_paragraph(kind)}).")


def incident_form(found: pl.DataFrame) -> None:
    """Declare a serious incident (AI Act Art. 3(49)) from one of the version's monitoring findings: it starts
    the Art. 73 clock, which the audit report then shows."""
    with st.expander("Declare a serious incident from a finding"):
        options = {json.dumps([r["kind"], r["subject"], r["window_start"].isoformat()]): f"{r['window_start']:%Y-%m-%d %H:%M} {r['kind']} ({r['severity']})"
                   for r in found.iter_rows(named=True)}
        st.selectbox("Finding", list(options), format_func=options.get, key="gov_incident_finding")
        st.selectbox("Kind (Art. 3(49))", list(INCIDENT_KINDS), key="gov_incident_kind",
                     help="A death: 10 days (Art. 73(4)); a widespread infringement or critical infrastructure: 2 days (Art. 73(3)); "
                          "any other serious incident: 15 days (Art. 73(2)).")
        st.button("Declare the incident", on_click=declare_incident, key="gov_incident_declare",
                  help="Recorded under your signed-in name; needs the governance scope.")
        ui.told("gov_incident_result")



st.subheader("Post-market monitoring")
deployed = ui.q(monitoring_svc.monitored, live=False)
if deployed.is_empty():
    ui.no_data("no deployed model's predictions.", "Push predictions and outcomes as JSON Lines (`POST /api/v1/ingest/model_monitoring`, "
               "`fleetscope ingest FILE`); beat evaluates hourly windows against each version's first day.")
else:
    versions = [f"{a}:{b}" for a, b in deployed.select("model_name", "model_version").rows()]
    pick = st.selectbox("Deployed model version", versions, key="gov_mon_model")
    mname, mversion = pick.rsplit(":", 1)
    wins = ui.q(monitoring_svc.windows, live=False, model=mname, version=mversion)
    if wins.is_empty():
        ui.no_data(f"no evaluated window of {pick}.", f"`fleetscope monitoring evaluate {mname} {mversion}` (or beat, hourly) evaluates them.")
    else:
        flagged = wins.filter(pl.col("status") != "ok")
        c = st.columns(4)
        c[0].metric("Windows", f"{wins.height}")
        c[1].metric("Flagged", f"{flagged.height}")
        last = wins.row(-1, named=True)
        c[2].metric("Accuracy (latest)", "-" if last["accuracy"] is None else f"{last['accuracy']:.3f}")
        c[3].metric("Largest PSI (latest)", "-" if last["feature_psi_max"] is None else f"{last['feature_psi_max']:.2f}")
        drift = ui.q(monitoring_svc.drift_over_time, live=False, model=mname, version=mversion)
        x = alt.X("window_start:T", title=ui.TIME_AXIS)
        if drift.height:
            psi_line = alt.Chart(drift).mark_line(point=True).encode(
                x=x, y=alt.Y("psi:Q", title="PSI against the reference"), color=alt.Color("feature:N", title="Feature"),
                tooltip=["feature", alt.Tooltip("psi:Q", format=".3f"), alt.Tooltip("ks:Q", format=".3f"), alt.Tooltip("ks_pvalue:Q", format=".2g"), alt.Tooltip("psi_pvalue:Q", format=".2g"), "level"])
            rule = alt.Chart(pl.DataFrame({"y": [0.25]})).mark_rule(strokeDash=[4, 4], color="#c62828").encode(y="y:Q")
            ui.chart(alt.layer(psi_line, rule), height=220)
            st.caption("Data drift: the population stability index of each feature against the reference window's deciles "
                       "(dashed: 0.25, a significant shift; Siddiqi 2006); the KS statistic and p-value in the tooltip.")
        acc = wins.select("window_start", "accuracy", "tpr", "fpr", "selection_rate").unpivot(index="window_start", variable_name="rate")
        ui.chart(alt.Chart(acc.drop_nulls("value")).mark_line(point=True).encode(
            x=x, y=alt.Y("value:Q", title="ratio"), color=alt.Color("rate:N", title="Rate"),
            tooltip=["rate", alt.Tooltip("value:Q", format=".3f")]), height=200)
        st.caption("Accuracy and error rates per window, over the predictions whose outcome has arrived.")
        fair_t = ui.q(monitoring_svc.fairness_over_time, live=False, model=mname, version=mversion)
        gaps = fair_t.filter(pl.col("group") == "*").drop_nulls("value")
        if gaps.height:
            base = alt.Chart(gaps).encode(x=x, color=alt.Color("attribute:N", title="Attribute"))
            ui.chart(alt.layer(
                base.mark_area(opacity=0.2).encode(y=alt.Y("ci_low:Q", title=f"{gaps['metric'][0]}"), y2="ci_high:Q"),
                base.mark_line(point=True).encode(y="value:Q", tooltip=["attribute", alt.Tooltip("value:Q", format=".3f"),
                                                                        alt.Tooltip("ci_low:Q", format=".3f"), alt.Tooltip("ci_high:Q", format=".3f")]),
                alt.Chart(pl.DataFrame({"y": [0.1]})).mark_rule(strokeDash=[4, 4], color="#c62828").encode(y="y:Q"),
            ), height=220)
            st.caption("Fairness over time: the watched disparity per group attribute with its 95% bootstrap interval (band); "
                       "dashed: the policy's 0.1. A finding pages only when the whole interval is above it.")
        found = ui.q(monitoring_svc.findings, live=False, model=mname, version=mversion)
        if found.height:
            st.dataframe(found.select("window_start", "kind", "severity", "subject", "summary"), hide_index=True)
            incident_form(found)
        attrs = sorted(set(fair_t["attribute"].to_list()))
        if attrs:
            attr = st.selectbox("Impossibility view by", attrs, key="gov_mon_attr")
            try:
                view = ui.q(monitoring_svc.impossibility, live=False, model=mname, version=mversion, attribute=attr)
            except (NotFound, FairnessInputError) as exc:  # too few groups or outcomes: said on the page, not a traceback
                st.info(f"No impossibility view: {exc}")
            else:
                st.dataframe(pl.DataFrame([{"criterion": k, "holds": v["holds"], "value": v["value"], "measure": v["measure"]}
                                           for k, v in view["criteria"].items()]), hide_index=True)
                st.dataframe(pl.DataFrame([{"group": g, "base_rate": b, **{k: (view["groups"].get(g) or {}).get(k) for k in ("count", "selection_rate", "tpr", "fpr", "ppv")}}
                                           for g, b in sorted(view["base_rates"].items())]), hide_index=True)
                st.caption(view["explanation"])

# --- rule matrix ------------------------------------------------------------------------------------

st.subheader("EU AI Act rule matrix")
if latest is None:
    ui.no_data("no rule results.", "Each rule's outcome with its evidence arrives with an audit run (`fleetscope audit report`, `POST /api/v1/audits`, or weekly by beat).")
else:
    results = ui.q(audit_svc.rule_results, live=False, audit_id=latest["audit_id"])
    c = st.columns(4)
    for col, status in zip(c, ("pass", "fail", "missing_evidence", "not_applicable")):
        col.metric(status.replace("_", " ").capitalize(), f"{latest[status]}")
    ui.chart(
        alt.Chart(results).mark_rect(stroke="white").encode(
            x=alt.X("rule_id:N", title="Rule", sort=None),
            y=alt.Y("model:N", title="Model"),
            color=alt.Color("status:N", scale=STATUS_COLORS, title="Status"),
            tooltip=["model", "rule_id", "title", "status", "reason", "citation"],
        ),
        height=120 + 40 * results["model"].n_unique(),  # the height includes the axes: rule ids below take about 100 px
    )
    with st.expander(f"Results with reasons and evidence ({results.height})"):
        st.dataframe(results, hide_index=True)

# --- reports and exports ----------------------------------------------------------------------------


def new_export() -> None:
    audit_id = st.session_state.get("gov_audit")
    actor = signin.acting("make_export")
    if actor is None:
        ui.tell("gov_export_result", False, "No export was made: making one needs the governance scope, and this session no longer holds it.")
        return
    try:
        out = au.make_export(ui.store(), settings, audit_id=audit_id, requested_by=actor.name)
    except (au.AuditError, OSError) as exc:
        ui.tell("gov_export_result", False, f"No export was made: {exc}")
        return
    ui.tell("gov_export_result", True, f"Signed export {out['export_id'][:12]} of audit {out['audit_id']} made ({out['size_bytes']:,} bytes).")
    st.session_state["gov_export"] = out["export_id"]  # offer the new bundle for download


st.subheader("Audit reports and export bundles")
if audits.is_empty():
    ui.no_data("no audits yet.", "Run one with `fleetscope audit report` or `POST /api/v1/audits` (beat files one weekly); its JSON, HTML and PDF reports and signed export bundles are downloadable here.")
else:
    labels = {r["audit_id"]: f"{r['audit_id']} · {r['scope']} · fail {r['fail']}, missing evidence {r['missing_evidence']}, pass {r['pass']}" for r in audits.iter_rows(named=True)}
    audit_id = st.selectbox("Audit", list(labels), format_func=labels.get, key="gov_audit")
    run = audits.filter(pl.col("audit_id") == audit_id).row(0, named=True)
    st.caption(f"Evaluated {run['as_of']:%Y-%m-%d %H:%M} UTC, {run['trigger'] or 'unknown trigger'}" + (f", by {run['requested_by']}" if run["requested_by"] else ""))
    cols = st.columns(3)
    for col, fmt in zip(cols, ("json", "html", "pdf")):
        data, why = report_file(audit_id, fmt) if fmt in (run["formats"] or "") else (None, f"no {fmt} report was filed")
        if data is None:
            col.warning(f"{fmt.upper()}: {why}")
        else:
            col.download_button(f"Report ({fmt.upper()}, {len(data) / 1024:,.0f} KiB)", data, file_name=f"fleetscope-audit-{audit_id}.{fmt}",
                                mime=MEDIA[fmt], key=f"gov_dl_{fmt}", width="stretch", on_click="ignore")

    ui.told("gov_export_result")
    exports = ui.q(audit_svc.audit_exports, fresh=True)
    mine = exports.filter(pl.col("audit_id") == audit_id)
    if mine.is_empty():
        ui.no_data("no signed export of this audit yet.")
    else:
        choices = {r["export_id"]: f"{r['export_id'][:12]} · {r['created_at']:%Y-%m-%d %H:%M} UTC · {r['size_bytes']:,} bytes · key {r['key_fingerprint'][:12]}"
                   for r in mine.iter_rows(named=True)}
        export_id = st.selectbox("Signed export bundle", list(choices), format_func=choices.get, key="gov_export")
        try:
            bundle, name = au.export_file(ui.store(), settings, export_id)
        except au.AuditError as exc:
            st.warning(str(exc))
        else:
            st.download_button(f"Export bundle (ZIP, {len(bundle) / 1024:,.0f} KiB)", bundle, file_name=name, mime="application/zip", key="gov_dl_export",
                               on_click="ignore")
        st.caption("Verify offline with `fleetscope verify BUNDLE` and the public key (`GET /api/v1/signing-key`): SHA-256 manifest, Ed25519 signature.")
    st.button("Make a new signed export of this audit", on_click=new_export, key="gov_new_export",
              help="Bundles the audit's reports and the evidence behind them (rule results, declarations, lineage, registry, fairness, energy) and signs it.")
