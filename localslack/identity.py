"""Who is who in a Slack workspace: the team, the app and its bot user, the people.

``Identity`` names what Slack puts in every payload (team, app, bot); the local
workspace's people and channels are fixed here, with ids Slack would accept (``U…``,
``C…``, ``D…``, ``S…``: the bot's mention and approver checks rely on those shapes).

Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Identity:
    """The workspace and the one app installed in it."""

    team_id: str
    team_domain: str
    team_name: str
    app_id: str
    bot_id: str
    bot_user_id: str
    bot_name: str
    verification_token: str

    @property
    def url(self) -> str:
        """The workspace URL auth.test answers (permalinks start with it)."""
        return f"https://{self.team_domain}.slack.com/"


@dataclass(frozen=True)
class Person:
    """A local user: ``role`` says what they are there for (shown in the page)."""

    id: str
    name: str
    real_name: str
    role: str
    color: str

    @property
    def email(self) -> str:
        """Their address, as Slack's profile and the local PagerDuty both have it."""
        return f"{self.name}@{EMAIL_DOMAIN}"


@dataclass(frozen=True)
class Channel:
    """A channel the bot is in; an ``im`` is one person's direct messages with the bot."""

    id: str
    name: str
    is_im: bool = False
    user: str | None = None  # the person of an im
    topic: str = ""

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "is_im": self.is_im,
            "user": self.user,
            "topic": self.topic,
        }


LOCAL = Identity(
    team_id="T0LOCAL",
    team_domain="opsloop-local",
    team_name="opsloop (local)",
    app_id="A0OPSLOOP",
    bot_id="B0OPSLOOP",
    bot_user_id="U0OPSLOOP",
    bot_name="opsloop",
    verification_token="local-verification-token",
)

EMAIL_DOMAIN = "opsloop-local.example"  # a reserved name: no mail leaves this machine
PEOPLE = (
    Person("U0ALICE", "alice", "Alice Martin", "asks for things", "#2f7d4f"),
    Person("U0BOB", "bob", "Bob Chen", "reviews; on call in PagerDuty", "#1d5fa8"),
    Person("U0CAROL", "carol", "Carol Diaz", "reviews and approves", "#8a3fa0"),
)
REVIEWERS_GROUP = "S0REVIEWERS"  # OPSLOOP_APPROVERS=S0REVIEWERS: bob decides
USERGROUPS = {REVIEWERS_GROUP: ["U0BOB"]}


def default_channels(people: tuple[Person, ...] = PEOPLE) -> tuple[Channel, ...]:
    public = (
        Channel("C0GENERAL", "general", topic="Anything. Mention @opsloop to ask it."),
        Channel("C0OPS", "ops", topic="Deploys, jobs and health checks"),
        Channel("C0DEPLOYS", "deploys", topic="Release coordination"),
    )
    ims = tuple(
        Channel(f"D0{p.name.upper()}", p.name, is_im=True, user=p.id, topic="Direct messages")
        for p in people
    )
    return public + ims


CHANNELS = default_channels()


def user_record(
    identity: Identity,
    user_id: str,
    name: str,
    real_name: str | None = None,
    *,
    email: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A user object as ``users.info`` answers it (``email`` in its profile, as Slack
    shows it to an app with ``users:read.email``)."""
    real = real_name or name.title()
    profile: dict[str, Any] = {"real_name": real, "display_name": name, "team": identity.team_id}
    if email:
        profile["email"] = email
    return {
        "id": user_id,
        "team_id": identity.team_id,
        "name": name,
        "deleted": False,
        "real_name": real,
        "tz": "Europe/Paris",
        "tz_label": "Central European Time",
        "tz_offset": 3600,
        "profile": profile,
        "is_admin": False,
        "is_owner": False,
        "is_bot": False,
        "is_app_user": False,
        "updated": 1700000000,
        **fields,
    }


def bot_record(identity: Identity) -> dict[str, Any]:
    return user_record(
        identity, identity.bot_user_id, identity.bot_name, is_bot=True, bot_id=identity.bot_id
    )


def bot_profile(identity: Identity) -> dict[str, Any]:
    """The ``bot_profile`` Slack attaches to a bot's messages."""
    return {
        "id": identity.bot_id,
        "app_id": identity.app_id,
        "name": identity.bot_name,
        "icons": {},
        "deleted": False,
        "updated": 1700000000,
        "team_id": identity.team_id,
    }


def bot_message(identity: Identity, ts: str, text: str = "") -> dict[str, Any]:
    """A message the bot posts, as Slack stores it."""
    return {
        "type": "message",
        "user": identity.bot_user_id,
        "bot_id": identity.bot_id,
        "app_id": identity.app_id,
        "team": identity.team_id,
        "bot_profile": bot_profile(identity),
        "text": text,
        "ts": ts,
    }
