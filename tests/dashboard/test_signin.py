"""The dashboard's sign-in under Streamlit's AppTest, against a real store: nothing shows before sign-in, a
bad token is refused without saying why, and what a signed-in user sees and does follows the token's scopes
as in the API (read: fleet pages; governance: the Governance page; admin: silences). Single sign-on (OIDC)
is driven through AppTest's ``user``, as Streamlit's ``st.user`` sees an identity provider's claims."""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from streamlit.testing.v1 import AppTest

from dashboard import signin
from dashboard.access import Backoff
from fleetscope.services import auth
from fleetscope.store import schema
from fleetscope.services.alerting import reads as alert_reads
from fleetscope.services import audit as audit_svc
from fleetscope.store import Store
from tests.dashboard.conftest import APP, data_dir_of, sign_in
from tests.dashboard.test_pages import healthy, metrics

FLEET_PAGES = ["Overview", "Health & SDC", "Reliability", "Network", "Energy & Carbon", "Teams & Cost", "Jobs", "Stragglers", "Serving", "Alerts", "Service"]


@pytest.fixture
def url(seeded_sqlite_url: str, tmp_path: Path) -> str:
    """A private copy of the seeded world: these tests create tokens, silences and exports."""
    shutil.copytree(data_dir_of(seeded_sqlite_url), tmp_path / "data")
    return f"sqlite:///{tmp_path / 'data' / 'fleetscope.store.db'}"


def app(url: str, monkeypatch: pytest.MonkeyPatch, **env: str) -> AppTest:
    monkeypatch.setenv("FLEETSCOPE_DATABASE_URL", url)
    monkeypatch.setenv("FLEETSCOPE_DATA_DIR", str(data_dir_of(url)))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return AppTest.from_file(str(APP), default_timeout=60)


def token(url: str, name: str, scopes: list[str]) -> str:
    store = Store.open(url)
    try:
        return auth.create_token(store.engine, name, scopes)
    finally:
        store.engine.dispose()


def revoke(url: str, name: str) -> None:
    store = Store.open(url)
    try:
        assert auth.revoke_token(store.engine, next(t["token_id"] for t in auth.list_tokens(store.engine) if t["name"] == name))
    finally:
        store.engine.dispose()


def submit(at: AppTest, secret: str) -> AppTest:
    at.text_input(key=signin.SECRET_INPUT_KEY).input(secret)
    return at.button(key="signin_submit").click().run()


def shows_nothing_of_the_fleet(at: AppTest) -> None:
    """Only the sign-in: no metric, table, chart, sidebar control or page link."""
    assert not at.metric and not at.dataframe and not at.get("arrow_vega_lite_chart")
    assert not at.sidebar.selectbox and not at.sidebar.radio
    assert [t.value for t in at.title] == ["Sign in to Fleetscope"]
    assert signin.SESSION_KEY not in at.session_state and "_filters" not in at.session_state
    assert nav_titles(at) == []


def nav_titles(at: AppTest) -> list[str]:
    """The pages the last run's st.navigation offered, in order (AppTest keeps them for switch_page)."""
    return [info["page_name"] for info in at._registered_pages.values() if info.get("script_path")]


def test_no_page_can_run_without_the_main_script() -> None:
    # Streamlit runs a pages/ folder beside the main script as pages of their own (without app.py, so
    # without the sign-in) until a run reaches st.navigation: the dashboard's pages live elsewhere.
    assert not (APP.parent / "pages").exists()
    assert sorted(p.stem for p in (APP.parent / "views").glob("*.py") if p.stem != "__init__") == sorted(
        ["overview", "health_sdc", "reliability", "network", "energy_carbon", "teams_cost", "jobs", "stragglers", "serving", "alerts", "service", "governance"])


def test_without_sign_in_no_page_content_appears(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    at.run()
    healthy(at)
    shows_nothing_of_the_fleet(at)
    assert at.text_input(key=signin.SECRET_INPUT_KEY).proto.type == at.text_input(key=signin.SECRET_INPUT_KEY).proto.PASSWORD
    # A deep link to a page leads to the sign-in too, not to the page.
    at = app(url, monkeypatch)
    at.query_params["job"] = "job-llm-c"
    at.run()
    shows_nothing_of_the_fleet(at)


@pytest.mark.parametrize("kind", ["unknown", "revoked", "expired", "not a token"])
def test_a_bad_token_is_refused_with_one_answer_for_every_reason(kind: str, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store.open(url)
    if kind == "unknown":
        secret = "fs_" + "x" * 43
    elif kind == "revoked":
        secret = auth.create_token(store.engine, "old", ["admin"])
        auth.revoke_token(store.engine, next(t["token_id"] for t in auth.list_tokens(store.engine) if t["name"] == "old"))
    elif kind == "expired":
        secret = auth.create_token(store.engine, "temp", ["admin"], expires_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    else:
        secret = "' OR 1=1 --"
    store.engine.dispose()
    at = app(url, monkeypatch)
    at.run()
    submit(at, secret)
    assert not at.exception
    assert [e.value for e in at.error] == [signin.FAILED]
    shows_nothing_of_the_fleet(at)
    assert at.session_state[signin.BACKOFF_KEY].failures == 1
    assert at.session_state[signin.SECRET_INPUT_KEY] == ""  # the form forgets what was typed


def test_a_valid_token_signs_in_and_stays_out_of_the_url(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = token(url, "ana", ["read"])
    at = app(url, monkeypatch)
    at.run()
    submit(at, secret)
    healthy(at)
    assert metrics(at)["GPUs"] == "64"
    assert at.session_state[signin.SESSION_KEY].name == "ana"
    assert all(secret not in str(v) for v in at.query_params.values())
    assert any(c.value.startswith("Signed in as **ana** (read)") for c in at.sidebar.caption)


def test_a_locked_form_refuses_even_a_valid_token_without_checking_it(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = token(url, "ana", ["read"])
    at = app(url, monkeypatch)
    at.session_state[signin.BACKOFF_KEY] = Backoff(failures=3, locked_until_s=time.monotonic() + 3600)
    at.run()
    submit(at, secret)
    assert [e.value for e in at.error][0].startswith("Too many failed sign-ins: try again in ")
    shows_nothing_of_the_fleet(at)
    store = Store.open(url)
    with store.engine.connect() as conn:  # the token was never verified, so never marked used
        assert conn.execute(select(schema.api_token.c.last_used_at).where(schema.api_token.c.name == "ana")).scalars().all() == [None]
    store.engine.dispose()


def test_a_token_revoked_while_signed_in_ends_the_session(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    sign_in(at, url, ("read",), name="ana")
    at.run()
    assert metrics(at)["GPUs"] == "64"
    revoke(url, "ana")
    at.run()
    shows_nothing_of_the_fleet(at)
    assert [e.value for e in at.error] == ["The token this session signed in with is no longer valid (revoked or expired): sign in again."]
    assert signin.TOKEN_KEY not in at.session_state


def test_sign_out(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    sign_in(at, url, ("read",))
    at.run()
    at.sidebar.button(key="signout").click().run()
    shows_nothing_of_the_fleet(at)
    assert [s.value for s in at.success] == ["Signed out."]
    assert signin.TOKEN_KEY not in at.session_state


def test_a_read_token_sees_fleet_pages_but_no_governance_and_no_silence_form(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    sign_in(at, url, ("read",), name="viewer")
    at.run()
    healthy(at)
    assert nav_titles(at) == FLEET_PAGES
    assert "Not shown, as they need the governance scope: Governance." in [c.value for c in at.sidebar.caption]
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        at.switch_page("views/governance.py")
    at.switch_page("views/alerts.py").run()
    healthy(at)
    assert metrics(at)["Firing"] == "4"
    assert not at.main.button and not at.main.text_area  # neither the create nor the expire form
    assert any("needs the admin scope" in c.value and "viewer has read" in c.value for c in at.caption)
    assert [i.value for i in at.info if "silences" in i.value] == ["No data yet: no silences."]  # no "create one below"


def test_a_governance_token_sees_only_the_governance_page(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    sign_in(at, url, ("governance",), name="auditor")
    at.run()
    healthy(at)
    assert nav_titles(at) == ["Governance"]
    assert [t.value for t in at.title] == ["Governance"]  # the one page it may see is its default
    assert not at.sidebar.selectbox  # the fleet filters read fleet data: not drawn
    before = audit_svc.audit_exports(Store.open(url)).height
    at.button(key="gov_new_export").click().run()
    healthy(at)
    after = audit_svc.audit_exports(Store.open(url))
    assert after.height == before + 1 and after["requested_by"][0] == "auditor"


def test_an_ingest_token_is_told_the_dashboard_needs_another_scope(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    sign_in(at, url, ("ingest",), name="agent")
    at.run()
    assert [e.value for e in at.error] == ["agent has ingest: the dashboard needs read, governance or admin."]
    assert not at.metric and not at.dataframe and nav_titles(at) == []
    at.button(key="signout").click().run()
    shows_nothing_of_the_fleet(at)


def test_an_admin_silence_is_created_by_the_token_and_a_revoked_one_writes_nothing(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch)
    sign_in(at, url, ("admin",), name="oncall-ana")
    at.run()
    at.switch_page("views/alerts.py").run()
    at.text_area(key="sil_matchers").input('alertname="GpuFellOffBus"')
    at.text_area(key="sil_comment").input("GPU sent for repair")
    at.button(key="sil_create").click().run()
    healthy(at)
    silences = alert_reads.silences(Store.open(url))
    assert silences.select("matchers", "created_by").rows() == [('alertname="GpuFellOffBus"', "oncall-ana")]
    # The token is revoked while the form is open: the next click writes nothing.
    revoke(url, "oncall-ana")
    at.text_area(key="sil_matchers").input('alertname="SdcSuspect"')
    at.button(key="sil_create").click().run()
    assert alert_reads.silences(Store.open(url)).height == 1
    shows_nothing_of_the_fleet(at)


# --- single sign-on -----------------------------------------------------------------------------------

OIDC = {"FLEETSCOPE_DASHBOARD_AUTH": "oidc", "FLEETSCOPE_DASHBOARD_OIDC_SCOPES": "alice@x.org=admin; *@x.org=read; group:auditors=governance"}


def test_oidc_asks_the_identity_provider_first(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch, **OIDC)
    at.user = {"is_logged_in": False}
    at.run()
    assert [t.value for t in at.title] == ["Sign in to Fleetscope"]
    assert [b.label for b in at.button] == ["Sign in with your identity provider"]
    assert not at.metric and not at.text_input  # no token form either


def test_oidc_maps_the_signed_in_user_to_scopes(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch, **OIDC)
    at.user = {"is_logged_in": True, "email": "Alice@X.org", "email_verified": True, "name": "Alice"}
    at.run()
    healthy(at)
    assert nav_titles(at) == [*FLEET_PAGES, "Governance"]
    at.switch_page("views/alerts.py").run()
    at.text_area(key="sil_matchers").input('alertname="SdcSuspect"')
    at.text_area(key="sil_comment").input("rerun on a spare")
    at.button(key="sil_create").click().run()
    healthy(at)
    assert alert_reads.silences(Store.open(url))["created_by"].to_list() == ["alice@x.org"]

    at = app(url, monkeypatch, **OIDC)
    at.user = {"is_logged_in": True, "email": "bob@x.org", "email_verified": True}
    at.run()
    assert nav_titles(at) == FLEET_PAGES

    at = app(url, monkeypatch, **OIDC)
    at.user = {"is_logged_in": True, "email": "carol@elsewhere.org", "groups": ["auditors"]}
    at.run()
    assert nav_titles(at) == ["Governance"]


def test_oidc_refuses_users_the_mapping_does_not_name_and_unverified_addresses(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch, **OIDC)
    at.user = {"is_logged_in": True, "email": "eve@y.org", "email_verified": True}
    at.run()
    assert [e.value for e in at.error] == ["eve@y.org has no scope: the dashboard needs read, governance or admin. "
                                           "Ask an administrator to add you to FLEETSCOPE_DASHBOARD_OIDC_SCOPES."]
    assert not at.metric and nav_titles(at) == []
    at = app(url, monkeypatch, **OIDC)
    at.user = {"is_logged_in": True, "email": "alice@x.org", "email_verified": False}
    at.run()
    assert [e.value for e in at.error] == ["The identity provider sent no verified e-mail address, which the dashboard needs to record who did what."]
    assert not at.metric and nav_titles(at) == []


def test_oidc_without_an_auth_section_or_with_a_bad_mapping_says_so(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(url, monkeypatch, **OIDC)
    at.user = {}  # what st.user holds where secrets.toml has no [auth]
    at.run()
    assert "no `[auth]` section" in at.error[0].value and not at.metric
    at = app(url, monkeypatch, **{**OIDC, "FLEETSCOPE_DASHBOARD_OIDC_SCOPES": "alice@x.org=root"})
    at.user = {"is_logged_in": True, "email": "alice@x.org"}
    at.run()
    assert at.error[0].value.startswith("Single sign-on is misconfigured: FLEETSCOPE_DASHBOARD_OIDC_SCOPES entry 1 ('alice@x.org=root'): unknown scope 'root'")
    assert not at.metric
