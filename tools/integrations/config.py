"""The models of ``integrations:`` in ``opsloop.yaml`` (DESIGN, "Integrations and alerts").

Tokens, keys and webhook secrets are ``SecretStr``: a logged config shows none of them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr, model_validator

from tools.config_model import Duration, KeyProblem, StrictModel

_REPO = re.compile(r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$")
_URL = re.compile(r"^https?://[^\s/?#]+(?:/[^\s?#]*)?$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _repo(value: str) -> str:
    if not _REPO.match(value):
        raise ValueError(f"{value!r} is not a repository: use owner/name")
    return value


def _api_url(value: str) -> str:
    if not _URL.match(value):
        raise ValueError(f"{value!r} is not an http(s) URL")
    return value.rstrip("/")


def _email(value: str) -> str:
    if not _EMAIL.match(value):
        raise ValueError(f"{value!r} is not an email address")
    return value


Repo = Annotated[str, AfterValidator(_repo)]
ApiUrl = Annotated[str, AfterValidator(_api_url)]
Email = Annotated[str, AfterValidator(_email)]


class GitHubConfig(StrictModel):
    """``integrations.github``: a token, or a GitHub App (``app_id``, ``private_key``,
    ``installation_id``); ``repos`` is an allowlist (any other repository is refused)."""

    token: SecretStr | None = None
    app_id: int | None = Field(None, ge=1)
    private_key: SecretStr | None = None
    installation_id: int | None = Field(None, ge=1)
    api_url: ApiUrl = "https://api.github.com"
    repos: list[Repo] = Field(min_length=1)
    webhook_secret: SecretStr | None = None
    poll_every: Duration = 15.0

    @model_validator(mode="after")
    def _one_way_in(self) -> GitHubConfig:
        app = (self.app_id, self.private_key, self.installation_id)
        if self.token is not None and any(v is not None for v in app):
            raise KeyProblem(("token",), "give a token or a GitHub App, not both")
        if self.token is None and not all(v is not None for v in app):
            raise KeyProblem(("token",), "is required (or app_id, private_key and installation_id)")
        return self


class PagerDutyConfig(StrictModel):
    """``integrations.pagerduty``: an API token; ``from_email`` is the ``From`` header
    PagerDuty requires on writes; ``webhook_secret`` verifies ``POST /alerts/pagerduty``."""

    token: SecretStr
    api_url: ApiUrl = "https://api.pagerduty.com"
    from_email: Email | None = None
    webhook_secret: SecretStr | None = None


class IntegrationsConfig(StrictModel):
    github: GitHubConfig | None = None
    pagerduty: PagerDutyConfig | None = None
