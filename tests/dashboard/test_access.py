"""dashboard.access: the scope rules the dashboard applies, the OIDC mapping of users to scopes, and the
failed-sign-in backoff, as pure functions."""

from __future__ import annotations

import pytest

from dashboard.access import MAX_LOCK_S, Access, Backoff, MappingError, Rule, oidc_access, parse_mapping, scopes_for

MAPPING = "alice@x.org=admin; *@x.org=read ;group:auditors=governance,read;;"


def test_parse_mapping() -> None:
    assert parse_mapping(MAPPING) == (
        Rule("email", "alice@x.org", frozenset({"admin"})),
        Rule("domain", "x.org", frozenset({"read"})),
        Rule("group", "auditors", frozenset({"governance", "read"})),
    )
    assert parse_mapping("") == () and parse_mapping(" ; ") == ()
    assert parse_mapping("Bob@Example.ORG=read") == (Rule("email", "bob@example.org", frozenset({"read"})),)


@pytest.mark.parametrize(
    "spec, why",
    [
        ("alice@x.org", "entry 1 ('alice@x.org'): expected pattern=scope[,scope...]"),
        ("alice@x.org=root", "entry 1 ('alice@x.org=root'): unknown scope 'root'; expected some of ingest, read, governance, admin"),
        ("*@x.org=read;bob@x.org=", "entry 2 ('bob@x.org='): no scope given"),
        ("=read", "entry 1 ('=read'): expected pattern=scope"),
        ("*=read", "entry 1 ('*=read'): a pattern is an e-mail address, *@domain or group:NAME (not '*')"),
        ("*@*=read", "a pattern is an e-mail address"),
        ("a*@x.org=read", "a pattern is an e-mail address"),
        ("alice=read", "a pattern is an e-mail address"),
        ("group:=read", "entry 1 ('group:=read'): group: needs a group name"),
    ],
)
def test_a_bad_mapping_names_the_entry_and_what_is_wrong(spec: str, why: str) -> None:
    with pytest.raises(MappingError) as exc:
        parse_mapping(spec)
    assert str(exc.value).startswith("FLEETSCOPE_DASHBOARD_OIDC_SCOPES ") and why in str(exc.value)


@pytest.mark.parametrize(
    "claims, scopes",
    [
        ({"email": "alice@x.org", "email_verified": True}, {"admin", "read"}),  # her own entry and her domain's
        ({"email": "ALICE@X.ORG"}, {"admin", "read"}),  # no email_verified claim: not said to be unverified
        ({"email": "bob@x.org"}, {"read"}),
        ({"email": "bob@sub.x.org"}, set()),  # a domain is one domain, not its subdomains
        ({"email": "bob@x.org.evil.com"}, set()),
        ({"email": "alice@x.org", "email_verified": False}, set()),
        ({"email": "alice@x.org", "email_verified": "false"}, set()),
        ({"email": "carol@y.org", "groups": ["auditors", "other"]}, {"governance", "read"}),
        ({"email": "carol@y.org", "groups": "auditors"}, {"governance", "read"}),
        ({"email": "carol@y.org", "groups": ["Auditors"]}, set()),  # group names compare exactly
        ({"groups": ["auditors"]}, {"governance", "read"}),
        ({"email": "eve@y.org"}, set()),
        ({}, set()),
        ({"email": ["alice@x.org"]}, set()),
    ],
)
def test_scopes_for(claims: dict, scopes: set[str]) -> None:
    assert scopes_for(parse_mapping(MAPPING), claims) == frozenset(scopes)


def test_oidc_access_names_the_user_by_verified_email() -> None:
    rules = parse_mapping(MAPPING)
    assert oidc_access(rules, {"email": "Alice@X.org", "email_verified": True}) == Access("alice@x.org", frozenset({"admin", "read"}), "oidc")
    assert oidc_access(rules, {"email": "eve@y.org"}) == Access("eve@y.org", frozenset(), "oidc")
    assert oidc_access(rules, {"email": "alice@x.org", "email_verified": False}) is None
    assert oidc_access(rules, {"groups": ["auditors"]}) is None  # scopes, but nobody to record actions under


def test_access_follows_the_api_scopes() -> None:
    reader = Access("ana", frozenset({"read"}), "token")
    assert reader.may_see("overview") and reader.may_see("alerts") and not reader.may_see("governance")
    assert not reader.may("create_silence") and not reader.may("expire_silence") and not reader.may("make_export")
    assert reader.why_not("admin") == "This needs the admin scope; ana has read."
    auditor = Access("audit", frozenset({"governance"}), "token")
    assert auditor.may_see("governance") and auditor.may("make_export") and not auditor.may_see("overview")
    admin = Access("root", frozenset({"admin"}), "token")  # admin allows everything, as in fleetscope.services.auth.Token
    assert all(admin.may_see(p) for p in ("overview", "governance")) and admin.may("create_silence") and admin.may("make_export")
    assert not Access("agent", frozenset({"ingest"}), "token").may_see("overview")


def test_backoff_doubles_the_lock_after_each_failure_up_to_a_cap() -> None:
    b = Backoff()
    assert b.wait_s(100.0) == 0
    b.failed(100.0)
    assert b.wait_s(100.0) == 1.0 and b.wait_s(100.5) == 0.5 and b.wait_s(101.0) == 0
    b.failed(101.0)
    b.failed(103.0)
    assert b.wait_s(103.0) == 4.0
    for _ in range(20):
        b.failed(200.0)
    assert b.failures == 23 and b.wait_s(200.0) == MAX_LOCK_S
    b.succeeded()
    assert b.failures == 0 and b.wait_s(200.0) == 0


def test_the_dashboard_verb_refuses_a_bad_mapping_before_starting(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from fleetscope.cli import main

    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FLEETSCOPE_DASHBOARD_AUTH", "oidc")
    monkeypatch.setenv("FLEETSCOPE_DASHBOARD_OIDC_SCOPES", "*@x.org=read;anyone=admin")
    result = CliRunner().invoke(main, ["dashboard", "--host", "127.0.0.1"])
    assert result.exit_code == 1
    assert "FLEETSCOPE_DASHBOARD_OIDC_SCOPES entry 2 ('anyone=admin'): a pattern is an e-mail address" in result.output
    assert not (tmp_path / "data").exists()
