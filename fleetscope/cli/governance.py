"""``fleetscope governance``: lineage (which data trained which model), the dataset and model registry, and
fairness evaluations."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from fleetscope.cli.common import _os_user, _store
from governance.fairness import FairnessInputError
from governance.registry import DatasetEntry, ModelEntry


@click.group()
def governance() -> None:
    """Data governance: lineage, the dataset and model registry, fairness.

    \b
    Examples:
      fleetscope governance lineage show cv-screener
      fleetscope governance registry model cv-screener 2 --purpose "CV screening"
      fleetscope governance fairness evaluate preds.parquet --model cv-screener --sensitive gender
    """


@governance.group()
def lineage() -> None:
    """Data lineage: which data trained which model.

    \b
    Examples:
      fleetscope governance lineage show cv-screener
      fleetscope governance lineage check cv-screener --dataset faces-2019
    """


@lineage.command("show")
@click.argument("model")
@click.option("--version", default=None, help="Model version (default: the latest registered).")
@click.option("--json", "as_json", is_flag=True)
def lineage_show(model: str, version: str | None, as_json: bool) -> None:
    """Datasets upstream of MODEL, each with the path that proves it, and the taints that reach it.

    \b
    Examples:
      fleetscope governance lineage show cv-screener
      fleetscope governance lineage show cv-screener --version 2 --json
    """
    from fleetscope.services import governance as gs  # lazy: keeps --help light

    try:
        out = gs.model_lineage(_store(), model, version)
    except gs.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
        return
    m = out["model"]
    click.echo(f"model {m['name']}@{m['version']} ({m['role']}): {m['intended_purpose'] or 'no intended purpose recorded'}")
    for u in out["upstream"]:
        click.echo(f"  {u['dataset']}  ({u['hops']} run{'s' if u['hops'] != 1 else ''} away)\n      {u['text']}")
    if not out["upstream"]:
        click.echo("  no upstream datasets recorded")
    for t in out["taints"]:
        click.echo(f"  TAINT {t['kind']} from {t['source']}: {t.get('detail') or ''}")


@lineage.command("check")
@click.argument("model")
@click.option("--dataset", required=True, help="Dataset name.")
@click.option("--namespace", default=None, help="Dataset namespace, where the name alone is ambiguous.")
@click.option("--version", default=None)
@click.option("--json", "as_json", is_flag=True)
def lineage_check(model: str, dataset: str, namespace: str | None, version: str | None, as_json: bool) -> None:
    """Did MODEL ever ingest DATASET (or anything derived from it)? Exits 0 for no, 3 for yes.

    \b
    Examples:
      fleetscope governance lineage check cv-screener --dataset faces-2019
      fleetscope governance lineage check cv-screener --dataset faces --namespace s3://raw --json
    """
    from fleetscope.services import governance as gs  # lazy: keeps --help light

    try:
        out = gs.model_ingested(_store(), model, dataset, namespace=namespace, version=version)
    except gs.NotFound as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
    elif out["answer"]:
        click.echo(f"YES: {out['model']} ingested {out['dataset']}\n  {out['text']}")
    else:
        click.echo(f"NO: {out['model']} did not ingest {out['dataset']}; searched {len(out['searched'])} upstream datasets: " + ", ".join(out["searched"]))
    for note in out["notes"]:
        click.echo(f"  note: {note}", err=True)
    sys.exit(3 if out["answer"] else 0)


@governance.group()
def registry() -> None:
    """The dataset and model registry behind lineage and the audit rules.

    \b
    Examples:
      fleetscope governance registry dataset s3://raw faces-2019 --license CC-BY-4.0 --personal-data --legal-basis consent
      fleetscope governance registry model cv-screener 2 --purpose "CV screening" --run 5f0c...
    """


@registry.command("dataset")
@click.argument("namespace")
@click.argument("name")
@click.option("--license", "license_", default=None)
@click.option("--personal-data/--no-personal-data", default=False)
@click.option("--special-category/--no-special-category", default=False, help="GDPR Art. 9 special categories.")
@click.option("--legal-basis", type=click.Choice(["consent", "contract", "legal_obligation", "vital_interests", "public_task", "legitimate_interests"]), default=None)
@click.option("--art9-condition", default=None, help="art9_2_a .. art9_2_j")
@click.option("--consent-reference", default=None)
@click.option("--provenance", default=None)
@click.option("--quarantine", "quarantine_reason", default=None, help="Quarantine the dataset, with this reason.")
def registry_dataset(namespace: str, name: str, license_: str | None, personal_data: bool, special_category: bool, legal_basis: str | None,
                     art9_condition: str | None, consent_reference: str | None, provenance: str | None, quarantine_reason: str | None) -> None:
    """Record NAMESPACE/NAME's governance attributes.

    \b
    Examples:
      fleetscope governance registry dataset s3://raw faces-2019 --license CC-BY-4.0 --personal-data --legal-basis consent
      fleetscope governance registry dataset s3://raw scraped-2020 --quarantine "licence unknown"
    """
    from fleetscope.services import governance as gs  # lazy: keeps --help light

    try:
        entry = DatasetEntry(namespace, name, license_, personal_data, special_category, legal_basis, art9_condition, consent_reference,
                             provenance, quarantine_reason is not None, quarantine_reason)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    gs.put_dataset(_store(), entry, actor=_os_user())
    click.echo(f"recorded {entry.node_id}" + "".join(f"\n  issue: {i}" for i in entry.issues()))


@registry.command("model")
@click.argument("name")
@click.argument("version")
@click.option("--purpose", default="", help="Intended purpose (AI Act Art. 3(12)).")
@click.option("--role", type=click.Choice(["provider", "deployer", "provider_and_deployer"]), default="provider", show_default=True)
@click.option("--run", "runs", multiple=True, help="OpenLineage run id that trained it; repeat for several.")
def registry_model(name: str, version: str, purpose: str, role: str, runs: tuple[str, ...]) -> None:
    """Register model NAME at VERSION.

    \b
    Example:
      fleetscope governance registry model cv-screener 2 --purpose "CV screening" --role provider --run 5f0c...
    """
    from fleetscope.services import governance as gs  # lazy: keeps --help light

    try:
        entry = ModelEntry(name, version, purpose, role, runs)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    gs.put_model(_store(), entry, actor=_os_user())
    click.echo(f"registered {entry.node_id}")


@governance.group("fairness")
def fairness_group() -> None:
    """Fairness evaluations of a model's predictions.

    \b
    Example:
      fleetscope governance fairness evaluate preds.parquet --model cv-screener --sensitive gender
    """


@fairness_group.command("evaluate")
@click.argument("predictions", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", required=True)
@click.option("--version", default=None)
@click.option("--sensitive", multiple=True, required=True, help="Sensitive feature column; repeat for several.")
@click.option("--y-true", default="y_true", show_default=True)
@click.option("--y-pred", default="y_pred", show_default=True)
@click.option("--y-score", default=None)
@click.option("--positive-label", default=None)
@click.option("--min-group-size", type=int, default=30, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def fairness_evaluate(predictions: str, model: str, version: str | None, sensitive: tuple[str, ...], y_true: str, y_pred: str,
                      y_score: str | None, positive_label: str | None, min_group_size: int, as_json: bool) -> None:
    """Evaluate PREDICTIONS (CSV or Parquet) for MODEL and record per-group aggregates (never the rows).
    Exits 0 when the model's fairness policy passes, 4 when it fails.

    \b
    Examples:
      fleetscope governance fairness evaluate preds.parquet --model cv-screener --sensitive gender --sensitive age_band
      fleetscope governance fairness evaluate preds.csv --model cv-screener --version 2 --sensitive gender --y-score score --json
    """
    from fleetscope.services import governance as gs  # lazy: keeps --help light

    try:
        out = gs.evaluate_fairness(_store(), model, Path(predictions).read_bytes(), sensitive=list(sensitive), version=version,
                                   y_true=y_true, y_pred=y_pred, y_score=y_score, positive_label=positive_label, min_group_size=min_group_size,
                                   actor=_os_user())
    except (gs.NotFound, FairnessInputError) as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(out, default=str))
    else:
        click.echo(f"{model}@{out['version']}: fairness policy {'PASSED' if out['passed'] else 'FAILED'} (evaluation {out['evaluation_id'][:12]})")
        for c in out["outcome"]["checks"]:
            verdict = "not judged" if c["passed"] is None else "pass" if c["passed"] else "FAIL"
            value = "n/a" if c["value"] is None else f"{c['value']:.4f}"
            click.echo(f"  {c['feature']}: {c['metric']} = {value} {c['comparison']} {c['threshold']} -> {verdict}{' (uncertain)' if c['uncertain'] else ''}")
        for c in out["outcome"]["conflicts"]:
            click.echo(f"  note ({c['feature']}): {c['explanation']}")
    sys.exit(4 if out["passed"] is False else 0)
