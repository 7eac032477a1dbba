"""Payload shapes, Standard Webhooks signatures (checked by an independent implementation), outbound
safety and the delivery policy; HTTP status handling against a real receiver on loopback."""

import base64
import datetime as dt
import hashlib
import hmac
import json
import random

import pytest

from fleetscope.services.alerting import dispatch as D
from fleetscope.services.alerting import notifiers as N
from fleetscope.services.alerting.labels import fingerprint
from fleetscope.services.alerting.rules import load_config
from tests.alerting.receiver import Receiver

T0 = dt.datetime(2027, 1, 1, 12, 0, 0, 250000, tzinfo=dt.UTC)
LOOPBACK = N.OutboundPolicy(allow_loopback=True)


def notification() -> D.Notification:
    config = load_config(text="external_url: http://fleetscope.example\nroute: {receiver: oncall, group_by: [alertname], group_wait: 0s}")
    mk = lambda host, gpu: {"alertname": "GpuFellOffBus", "severity": "critical", "host": host, "gpu_uuid": gpu}
    firing = D.Alert(fingerprint(mk("n1", "G1")), mk("n1", "G1"), {"summary": "G1 fell off", "runbook_url": "https://r"}, T0)
    resolved = D.Alert(fingerprint(mk("n2", "G2")), mk("n2", "G2"), {"summary": "G2 fell off", "runbook_url": "https://r"}, T0, T0 + dt.timedelta(minutes=5))
    groups, notes = D.dispatch(config, [firing], {}, [], T0)
    groups, _ = D.dispatch(config, [firing, D.Alert(resolved.fingerprint, resolved.labels, resolved.annotations, T0)], groups, [], T0 + dt.timedelta(minutes=1))
    _, notes = D.dispatch(config, [firing, resolved], groups, [], T0 + dt.timedelta(minutes=10))
    (n,) = notes
    return n


def message() -> N.Message:
    n = notification()
    return N.Message("msg_2abc", n.data(), n.created_at)


def test_alertmanager_v4_payload_field_by_field():
    body = N.WebhookNotifier("http://x").body(message())
    assert set(body) == {"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels", "commonLabels",
                         "commonAnnotations", "externalURL", "alerts"}
    assert body["version"] == "4"
    assert body["groupKey"] == '{}:{alertname="GpuFellOffBus"}'
    assert body["truncatedAlerts"] == 0
    assert body["status"] == "firing"
    assert body["receiver"] == "oncall"
    assert body["groupLabels"] == {"alertname": "GpuFellOffBus"}
    assert body["commonLabels"] == {"alertname": "GpuFellOffBus", "severity": "critical"}
    assert body["commonAnnotations"] == {"runbook_url": "https://r"}
    assert body["externalURL"] == "http://fleetscope.example"
    a1, a2 = body["alerts"]
    for a in (a1, a2):
        assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
    assert a1["status"] == "firing" and a1["labels"]["gpu_uuid"] == "G1" and a1["endsAt"] == "0001-01-01T00:00:00Z"
    assert a1["startsAt"] == "2027-01-01T12:00:00.25Z"
    assert a1["fingerprint"] == fingerprint(a1["labels"])
    assert a2["status"] == "resolved" and a2["endsAt"] == "2027-01-01T12:05:00.25Z"
    # Serialises as JSON a Go receiver can read (times parse as RFC 3339).
    for a in body["alerts"]:
        dt.datetime.fromisoformat(a["startsAt"].replace("Z", "+00:00"))


def test_v4_truncation_and_send_resolved_false():
    msg = message()
    body = N.WebhookNotifier("http://x", max_alerts=1).body(msg)
    assert len(body["alerts"]) == 1 and body["truncatedAlerts"] == 1
    body = N.WebhookNotifier("http://x", send_resolved=False).body(msg)
    assert [a["status"] for a in body["alerts"]] == ["firing"]


def test_alertmanager_push_body():
    body = N.AlertmanagerNotifier("http://am:9093/").body(message())
    assert N.AlertmanagerNotifier("http://am:9093/").target() == "http://am:9093/api/v2/alerts"
    assert "endsAt" not in body[0] and body[1]["endsAt"] == "2027-01-01T12:05:00.25Z"
    assert set(body[0]) == {"labels", "annotations", "startsAt", "generatorURL"}


def test_slack_text_and_blocks():
    body = N.SlackNotifier("https://hooks.slack.com/services/x").body(message())
    assert body["text"] == "[FIRING:1] GpuFellOffBus"
    assert body["blocks"][0]["type"] == "header"
    sections = [b for b in body["blocks"] if b["type"] == "section"]
    assert len(sections) == 2 and ":red_circle: *G1 fell off*" in sections[0]["text"]["text"]
    assert "<https://r|Runbook>" in sections[0]["text"]["text"]


def independent_verify(secret: str, headers: dict, body: bytes, tolerance_s: int = 300, now: float | None = None) -> bool:
    """Standard Webhooks verification written from the spec, sharing no code with the notifier."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    msg_id, ts = headers["webhook-id"], headers["webhook-timestamp"]
    if abs((now or dt.datetime.now(dt.UTC).timestamp()) - int(ts)) > tolerance_s:
        return False
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    for part in headers["webhook-signature"].split(" "):
        version, _, sig = part.partition(",")
        if version == "v1" and hmac.compare_digest(sig, expected):
            return True
    return False


def test_standard_webhooks_signature_and_rotation():
    old, new = N.generate_secret(), N.generate_secret()
    assert old.startswith("whsec_") and len(base64.b64decode(old[6:])) == 24
    now = dt.datetime.now(dt.UTC)
    notifier = N.StandardWebhookNotifier("http://x", secrets=(old, new))
    url, body, headers = notifier.render(message(), now)
    assert headers["webhook-id"] == "msg_2abc" and headers["webhook-timestamp"] == str(int(now.timestamp()))
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert independent_verify(old, headers, body) and independent_verify(new, headers, body)
    assert not independent_verify(N.generate_secret(), headers, body)
    assert not independent_verify(old, headers, body + b" ")
    doc = json.loads(body)
    assert doc["type"] == "alert.firing" and doc["data"]["version"] == "4"


def test_standard_webhooks_known_vector():
    # The spec's reference libraries' test vector: this secret, id, timestamp and payload.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    sig = N.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize("url, ok", [
    ("http://169.254.169.254/latest/meta-data", False),
    ("http://[fe80::1]/", False),
    ("http://100.100.100.200/", False),
    ("http://[fd00:ec2::254]/", False),
    ("http://[::ffff:169.254.169.254]/", False),
    ("http://10.1.2.3/hook", False),
    ("http://192.168.1.1/", False),
    ("http://127.0.0.1:8080/", False),
    ("http://[::1]/", False),
    ("file:///etc/passwd", False),
    ("http://93.184.215.14/hook", True),
])
def test_outbound_policy_default(url, ok):
    if ok:
        assert N.check_url(url, N.OutboundPolicy()) == ["93.184.215.14"]
    else:
        with pytest.raises(N.UnsafeURL):
            N.check_url(url, N.OutboundPolicy())


def test_outbound_policy_settings_and_dns():
    assert N.check_url("http://127.0.0.1:1/", LOOPBACK)
    assert N.check_url("http://10.0.0.1/", N.OutboundPolicy(allow_private=True))
    # Metadata stays refused whatever is allowed, including through a name that resolves to it.
    everything = N.OutboundPolicy(allow_loopback=True, allow_private=True)
    with pytest.raises(N.UnsafeURL, match="metadata"):
        N.check_url("http://metadata.internal/", everything, resolver=lambda h, p: ["169.254.169.254"])
    with pytest.raises(N.UnsafeURL):
        N.check_url("http://rebind.example/", N.OutboundPolicy(), resolver=lambda h, p: ["93.184.215.14", "10.0.0.5"])


def test_unsafe_url_refused_before_any_request():
    with Receiver() as rx:
        with N.OutboundClient() as client, pytest.raises(N.UnsafeURL):
            N.WebhookNotifier(rx.url).send(message(), client, N.OutboundPolicy())
        assert rx.requests == []


def test_retry_policy():
    p = N.RetryPolicy(base_s=1, cap_s=60, dead_after_s=3600)
    rng = random.Random(1)
    waits = [N.backoff_s(n, p, rng) for n in range(1, 10)]
    for n, w in enumerate(waits, start=1):
        ceiling = min(60, 2 ** (n - 1))
        assert ceiling / 2 <= w <= ceiling
    err = N.DeliveryError("HTTP 503", retryable=True, status_code=503)
    d = N.decide(err, 1, T0, T0, p, rng)
    assert d.status == "pending" and T0 < d.next_attempt_at <= T0 + dt.timedelta(seconds=1)
    d = N.decide(N.DeliveryError("HTTP 429", retryable=True, retry_after_s=120), 1, T0, T0, p)
    assert d.next_attempt_at == T0 + dt.timedelta(seconds=120)
    assert N.decide(err, 20, T0, T0 + dt.timedelta(seconds=3590), p).status == "dead"
    assert N.decide(N.DeliveryError("HTTP 404", retryable=False), 1, T0, T0, p).status == "dead"
    assert N.decide(N.DeliveryError("HTTP 410", retryable=False, disable=True), 1, T0, T0, p).status == "disabled"
    assert N.decide(None, 1, T0, T0, p).status == "delivered"


@pytest.mark.parametrize("status, retryable, disable", [(500, True, False), (503, True, False), (408, True, False), (429, True, False),
                                                        (400, False, False), (404, False, False), (301, False, False), (410, False, True)])
def test_http_statuses_against_a_real_receiver(status, retryable, disable):
    with Receiver(answer=lambda req: (status, {"retry-after": "7"} if status == 429 else {})) as rx, N.OutboundClient() as client:
        with pytest.raises(N.DeliveryError) as exc:
            N.WebhookNotifier(rx.url + "/hook").send(message(), client, LOOPBACK)
        assert (exc.value.retryable, exc.value.disable, exc.value.status_code) == (retryable, disable, status)
        if status == 429:
            assert exc.value.retry_after_s == 7
        assert len(rx.requests) == 1 and rx.requests[0]["headers"]["webhook-id"] == "msg_2abc"


def test_connection_refused_is_retryable():
    port = Receiver().port  # nothing listens there
    with N.OutboundClient() as client, pytest.raises(N.DeliveryError) as exc:
        N.WebhookNotifier(f"http://127.0.0.1:{port}/").send(message(), client, LOOPBACK)
    assert exc.value.retryable


def test_retry_after_http_date():
    now = dt.datetime(2027, 1, 1, tzinfo=dt.UTC)
    assert N.parse_retry_after("Fri, 01 Jan 2027 00:00:30 GMT", now) == 30
    assert N.parse_retry_after("garbage", now) is None


def test_delivery_connects_to_the_address_that_was_checked():
    """DNS rebinding: the name is resolved once, by the check, and the request goes to that address with
    the name in the Host header. `rebind.test` resolves nowhere on this machine, so the delivery only
    succeeds if the client never looks the name up again."""
    with Receiver() as rx:
        port = rx.url.rsplit(":", 1)[1].split("/")[0]
        url = rx.url.replace("127.0.0.1", "rebind.test")
        calls = []

        def once(host, p):
            calls.append((host, p))
            return ["127.0.0.1"]

        with N.OutboundClient() as client:
            assert N.WebhookNotifier(url).send(message(), client, LOOPBACK, resolver=once) == 200
        assert calls == [("rebind.test", int(port))]
        (req,) = rx.requests
        assert req["headers"]["host"] == f"rebind.test:{port}"
        # a first address that refuses connections is passed over for the next checked one
        with N.OutboundClient() as client:
            assert N.WebhookNotifier(url).send(message(), client, LOOPBACK, resolver=lambda h, p: ["127.0.0.2", "127.0.0.1"]) == 200


def test_pinned_url_keeps_name_for_host_header_and_tls():
    from fleetscope.services.alerting.outbound import _target

    def shown(url, addr):
        target, headers, ext = _target(url, addr)
        return (target.scheme, target.host, target.port, target.target), dict(headers), ext

    assert shown("https://hooks.example/x?y=1", "93.184.215.14") == (
        (b"https", b"93.184.215.14", 443, b"/x?y=1"), {b"host": b"hooks.example"}, {"sni_hostname": "hooks.example"})
    assert shown("http://hooks.example:8080/a", "2606:2800:21f:cb07:6820:80da:af6b:8b2c") == (
        (b"http", b"2606:2800:21f:cb07:6820:80da:af6b:8b2c", 8080, b"/a"), {b"host": b"hooks.example:8080"}, {})
    # an internationalised name goes as IDNA; credentials in the URL go as Basic auth (RFC 7617)
    assert shown("https://ops:s%40cret@bücher.example/x", "93.184.215.14") == (
        (b"https", b"93.184.215.14", 443, b"/x"),
        {b"host": b"xn--bcher-kva.example", b"authorization": b"Basic " + base64.b64encode(b"ops:s@cret")},
        {"sni_hostname": "xn--bcher-kva.example"})


def test_pinned_delivery_keeps_url_credentials():
    with Receiver() as rx:
        port = rx.url.rsplit(":", 1)[1].split("/")[0]
        url = rx.url.replace("http://127.0.0.1", "http://ops:s%40cret@hooks.test")
        with N.OutboundClient() as client:
            assert N.WebhookNotifier(url).send(message(), client, LOOPBACK, resolver=lambda h, p: ["127.0.0.1"]) == 200
        (req,) = rx.requests
        assert req["headers"]["authorization"] == "Basic " + base64.b64encode(b"ops:s@cret").decode()
        assert req["headers"]["host"] == f"hooks.test:{port}"
