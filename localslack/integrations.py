"""The GitHub and PagerDuty of ``opsloop local``, and the alert its page fires.

Local mode's opsloop.yaml enables ``integrations.github``, ``integrations.pagerduty`` and
``alerts.generic`` with ``api_url`` pointing at the page's own port, where
:class:`LocalIntegrations` serves the fakes the tests use (:mod:`localslack.github` under
``/github``, :mod:`localslack.pagerduty` under ``/pagerduty``), so the bot runs its real
clients against them:

* GitHub has one repository, ``acme/platform``, whose ``deploy.yml`` takes ``service``
  and ``environment``; a dispatched run takes ``RUN_SECONDS`` and succeeds, and GitHub
  tells the app so as GitHub would, with a signed ``workflow_run`` webhook to
  ``POST /hooks/github`` (the poll every ``poll_every`` is the fallback);
* PagerDuty knows the page's people by their emails (the same as their Slack profiles'),
  has bob on call for the schedule ``SCHEDULE``, and one open incident;
* ``fire_alert`` is the page's "Fire an alert" button: a monitoring system's
  ``POST /alerts/generic``, signed as opsloop.yaml's ``alerts.generic.secret`` says.

The credentials are fixed, not secret: whoever reaches the page's port can act as anyone
in the workspace already (``localslack.server`` warns when that is beyond this machine).
Nothing here imports ``bot``: the alert is signed here, by the documented scheme.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from localslack.github import FakeGitHub
from localslack.identity import EMAIL_DOMAIN, PEOPLE
from localslack.pagerduty import FakePagerDuty

log = logging.getLogger("opsloop.local.integrations")

GITHUB_PREFIX = "/github"
PAGERDUTY_PREFIX = "/pagerduty"
REPO = "acme/platform"
WORKFLOW = "deploy.yml"
WORKFLOW_INPUTS = frozenset({"service", "environment", "version", "opsloop_key"})
# The key in the run's name lets a retried dispatch find its run exactly.
RUN_NAME = "Deploy {service} to {environment} {opsloop_key}"
RUN_SECONDS = 4.0  # queued, in progress at half of it, then success
SCHEDULE = "P0ONCALL"  # opsloop.yaml: approvers: [oncall:P0ONCALL]
ESCALATION_POLICY = "P0OPSPOL"
ON_CALL = "bob"
BOT_EMAIL = f"opsloop@{EMAIL_DOMAIN}"  # PagerDuty's From on writes: a user it knows

GITHUB_TOKEN = "ghp_local0000000000000000000000000000000"
GITHUB_WEBHOOK_SECRET = "local-github-webhook-secret"
PAGERDUTY_TOKEN = "u+local-pagerduty-token"
ALERT_SECRET = "local-alert-secret"

# How POST /alerts/generic is signed (README, "Alerts"; bot/alerts.py checks it):
# X-Opsloop-Signature: v1=<hex HMAC-SHA256 of "v1:<timestamp>:alerts/generic:<body>">.
ALERT_PATH = "alerts/generic"
TIMESTAMP_HEADER = "X-Opsloop-Request-Timestamp"
SIGNATURE_HEADER = "X-Opsloop-Signature"
ALERT_TIMEOUT_S = 10.0


def config_values() -> dict[str, str]:
    """The ``${OPSLOOP_LOCAL_*}`` values of opsloop.yaml that reach these fakes."""
    return {
        "OPSLOOP_LOCAL_GITHUB_TOKEN": GITHUB_TOKEN,
        "OPSLOOP_LOCAL_GITHUB_WEBHOOK_SECRET": GITHUB_WEBHOOK_SECRET,
        "OPSLOOP_LOCAL_PAGERDUTY_TOKEN": PAGERDUTY_TOKEN,
        "OPSLOOP_LOCAL_PAGERDUTY_FROM": BOT_EMAIL,
        "OPSLOOP_LOCAL_ALERT_SECRET": ALERT_SECRET,
    }


def alert_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``X-Opsloop-Signature`` of ``body`` for ``POST /alerts/generic`` at ``timestamp``."""
    base = f"v1:{timestamp}:{ALERT_PATH}:".encode() + body
    return "v1=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def alert_body(fired_by: str, fingerprint: str) -> dict[str, Any]:
    """The alert the button fires: the generic shape, one firing alert about api."""
    return {
        "id": fingerprint,  # a delivery's id: a resend would be stored once
        "fingerprint": fingerprint,
        "status": "firing",
        "summary": "api: 5xx responses above 5% for 5 minutes",
        "labels": {"alertname": "ApiErrorRate", "service": "api", "severity": "page"},
        "annotations": {"fired_by": f"{fired_by}, with the local page's Fire an alert button"},
    }


@dataclass(frozen=True)
class AlertSent:
    """What the app answered the alert: its HTTP status and JSON (or a one-line error)."""

    status: int
    answer: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.status == 200


class LocalIntegrations:
    """The fakes on the page's port at ``url`` (``http://host:port/``), and the button.
    ``alert_channel``: where opsloop.yaml's ``alerts.generic`` opens threads (None: the
    file does not enable it, and the page hides the button)."""

    def __init__(self, url: str, *, run_seconds: float | None = None) -> None:
        self.url = url
        self.alert_channel: str | None = None
        self.github = FakeGitHub(
            token=GITHUB_TOKEN,
            repos=(REPO,),
            auto=RUN_SECONDS if run_seconds is None else run_seconds,
            hooks=[(url + "hooks/github", GITHUB_WEBHOOK_SECRET)],
            # A thread still waiting on a run of the last start must not find a new one
            # by its id: ids go on from the time (the runs themselves are not kept).
            first_id=int(time.time() * 10),
        )
        self.github.workflows[REPO] = []  # its own deploy.yml instead of the default one
        self.github.add_workflow(
            REPO, WORKFLOW, name="Deploy", inputs=set(WORKFLOW_INPUTS), run_name=RUN_NAME
        )
        now = datetime.now(UTC).replace(second=0, microsecond=0)
        self.pagerduty = FakePagerDuty(token=PAGERDUTY_TOKEN, clock=now)
        self._session: aiohttp.ClientSession | None = None

    def add_routes(self, app: web.Application) -> None:
        self.github.mount(app, GITHUB_PREFIX, self.url + GITHUB_PREFIX.strip("/"))
        self.pagerduty.mount(app, PAGERDUTY_PREFIX, self.url + PAGERDUTY_PREFIX.strip("/"))
        self._set_up_pagerduty()

    def _set_up_pagerduty(self) -> None:
        pd = self.pagerduty
        for n, person in enumerate(PEOPLE, start=1):
            pd.add_user(f"P0USER{n}", person.real_name, person.email)
        pd.add_user("P0BOT", "opsloop", BOT_EMAIL)
        on_call = next(f"P0USER{n}" for n, p in enumerate(PEOPLE, 1) if p.name == ON_CALL)
        pd.put_on_call([on_call], schedule=SCHEDULE, escalation_policy=ESCALATION_POLICY)
        pd.add_incident("P0INC01", "api: 5xx responses above 5%", service="P0API")

    async def fire_alert(self, fired_by: str) -> AlertSent:
        """Send the app one new firing alert, as a monitoring system would."""
        body = json.dumps(alert_body(fired_by, f"local-{uuid.uuid4().hex[:12]}")).encode()
        stamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: stamp,
            SIGNATURE_HEADER: alert_signature(ALERT_SECRET, stamp, body),
        }
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=ALERT_TIMEOUT_S)
            self._session = aiohttp.ClientSession(timeout=timeout)
        try:
            async with self._session.post(self.url + ALERT_PATH, data=body, headers=headers) as r:
                text = await r.text()
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("the local alert did not reach the app: %s", exc)
            return AlertSent(0, {"error": f"the app did not answer ({type(exc).__name__})"})
        try:
            answer = json.loads(text)
        except ValueError:
            answer = {"error": text[:200]}
        return AlertSent(status, answer if isinstance(answer, dict) else {"answer": answer})

    async def close(self) -> None:
        await self.github.close()
        self.pagerduty.close()
        if self._session is not None:
            await self._session.close()
