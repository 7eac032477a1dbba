"""The README is part of the interface: its configuration table must list every setting."""

from pathlib import Path

from fleetscope import settings

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_lists_every_setting():
    from fleetscope.services.alerting import config as alerting_config

    missing = [name for name, _, _ in [*settings.table(), *alerting_config.table()] if f"`{name}`" not in README]
    assert missing == []


def test_readme_has_the_two_commands():
    assert "fleetscope demo" in README
    assert "python -m pytest" in README
