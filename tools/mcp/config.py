"""The model of ``tools.mcp.<name>`` in opsloop.yaml: where one MCP server is, the one
rule for a server's name, and how a server's tool names become names the model API
takes. The file's reader (``engine/config_file.py``) and
:class:`~tools.mcp.source.McpSource` both use these, so they refuse the same things."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, PrivateAttr, SecretStr, ValidationInfo, model_validator

from tools.config_model import Duration, KeyProblem, StrictModel, plain

# A server's tools are registered as mcp__<server>__<tool>, and Anthropic takes tool
# names of 1-64 characters of a-z A-Z 0-9 _ -. MCP allows more (``.``, ``/``, up to 128
# characters), so a tool's name is mapped (``registered_name``); a server name of at most
# 40 leaves every tool at least 8 characters of its own name before the hash suffix.
MAX_TOOL_NAME = 64
MAX_SERVER_NAME = 40
_SERVER_NAME = re.compile(rf"[a-zA-Z0-9_-]{{1,{MAX_SERVER_NAME}}}")
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
_SUFFIX = 8  # hex digits of sha256 after a cut name: collisions need 4 billion names
# Connecting (spawn + handshake, or the first HTTP round trip) gives up after this.
CONNECT_TIMEOUT_S = 20.0
# A secret shorter than this is not looked for in text: it would mask ordinary words.
MIN_SECRET = 4
KEPT_OBTAINED = 16  # tokens OAuth gave, redacted while they may still be live
ELICITATION_TIMEOUT_S = 600.0  # 10 minutes: the MCP session stays open while it waits
INPUT_REQUIRED_TIMEOUT_S = 86400.0  # a day: nothing is held open meanwhile


def server_name(name: str) -> str:
    """``name`` if it can name an MCP server, else ``ValueError`` (one line)."""
    if not isinstance(name, str) or not _SERVER_NAME.fullmatch(name):
        raise ValueError(
            f"a server name is 1-{MAX_SERVER_NAME} letters, digits, _ or - (its tools are "
            f"named mcp__<server>__<tool>, at most {MAX_TOOL_NAME} characters)"
        )
    return name


def registered_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>`` in the model API's alphabet, the same for the same
    names every time: a character other than a-z A-Z 0-9 _ - becomes ``_``, and a name
    over 64 characters is cut, ending in ``_`` and 8 hex digits of the sha256 of the
    server's own tool name (so two long names that share a start stay apart)."""
    name = f"mcp__{server}__{_NOT_ALLOWED.sub('_', tool) or '_'}"
    if len(name) <= MAX_TOOL_NAME:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()[:_SUFFIX]
    return f"{name[: MAX_TOOL_NAME - _SUFFIX - 1]}_{digest}"


ServerName = Annotated[str, AfterValidator(server_name)]

# Where serve receives an authorization's redirect (bot/oauth_callback.py): the path a
# ``redirect_url`` must reach.
CALLBACK_PATH = "/oauth/callback"
# Whom a new authorization link is posted to (bot/oauth_notice.py): people, each in
# their DM with the app, so user ids only (a user group has no DM).
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,}")


def _admin(value: str) -> str:
    if not _USER_ID.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a Slack user id (U…, W…): the link is sent privately to each admin"
        )
    return value


Admin = Annotated[str, AfterValidator(_admin)]


def _http_url(value: str | None, key: str) -> None:
    if value is not None and urlsplit(value).scheme not in ("http", "https"):
        raise KeyProblem((key,), f"must be an http or https URL, not {value!r}")


class McpAuth(StrictModel):
    """``auth:`` of an HTTP MCP server: OAuth through the SDK's client (tools/mcp/auth.py),
    tokens kept in the database and refreshed.

    ``client_credentials``: a machine client (``client_id`` and ``client_secret``, or a
    ``private_key`` in PEM that signs a JWT assertion with ``signing_algorithm``,
    RFC 7523), no person involved. ``authorization_code``: an admin authorizes once
    through a link opsloop gives (``opsloop doctor`` shows it) and the authorization
    server sends them back to ``redirect_url``, which must reach serve's
    ``GET /oauth/callback``; with ``client_id`` (and ``client_secret``) the client is
    pre-registered, without it opsloop registers itself (dynamic registration, or
    ``client_metadata_url`` where the server takes one). ``admins`` (Slack user ids,
    ``authorization_code`` only): each new link is also posted to them privately. ``issuer``
    names the authorization server the credentials belong to: they are then never sent
    to another one the MCP server points at.
    """

    type: Literal["client_credentials", "authorization_code"]
    client_id: str | None = None
    client_secret: SecretStr | None = None
    private_key: SecretStr | None = None
    signing_algorithm: str = "RS256"
    scope: str | None = None
    issuer: str | None = None
    token_endpoint_auth_method: (
        Literal["client_secret_basic", "client_secret_post", "none"] | None
    ) = None
    redirect_url: str | None = None
    client_metadata_url: str | None = None
    admins: list[Admin] = Field(default_factory=list)

    @model_validator(mode="after")
    def _complete(self) -> McpAuth:
        _http_url(self.issuer, "issuer")
        _http_url(self.redirect_url, "redirect_url")
        if self.client_metadata_url is not None and (
            urlsplit(self.client_metadata_url).scheme != "https"
            or urlsplit(self.client_metadata_url).path in ("", "/")
        ):
            raise KeyProblem(("client_metadata_url",), "must be an https URL with a path")
        if self.client_secret is not None and self.client_id is None:
            raise ValueError("client_secret goes with client_id")
        if self.token_endpoint_auth_method == "none" and self.client_secret is not None:
            raise KeyProblem(("token_endpoint_auth_method",), "none sends no client_secret")
        if self.private_key is not None and (
            self.type != "client_credentials" or self.client_secret is not None
        ):
            raise ValueError("private_key goes with client_credentials, instead of client_secret")
        if self.type == "client_credentials":
            if self.client_id is None or (self.client_secret is None and self.private_key is None):
                raise ValueError(
                    "client_credentials needs client_id, and client_secret or private_key"
                )
            if self.token_endpoint_auth_method == "none":
                raise KeyProblem(
                    ("token_endpoint_auth_method",), "client_credentials sends a secret"
                )
            if self.redirect_url is not None or self.client_metadata_url is not None:
                raise ValueError("redirect_url and client_metadata_url go with authorization_code")
            if self.admins:
                raise KeyProblem(
                    ("admins",), "goes with authorization_code (client_credentials needs no one)"
                )
        elif self.redirect_url is None:
            raise ValueError(
                f"authorization_code needs redirect_url (serve's {CALLBACK_PATH} as the "
                "authorization server's redirect reaches it)"
            )
        return self

    def plain_secret(self) -> str | None:
        return self.client_secret.get_secret_value() if self.client_secret else None

    def plain_key(self) -> str | None:
        return self.private_key.get_secret_value() if self.private_key else None

    @property
    def auth_method(self) -> str:
        """How the token endpoint is told who we are: as configured, else the secret in
        a Basic header when there is one (RFC 6749's must-support), else nothing."""
        if self.token_endpoint_auth_method is not None:
            return self.token_endpoint_auth_method
        return "client_secret_basic" if self.client_secret is not None else "none"


class McpServerConfig(StrictModel):
    """Where an MCP server is: ``url`` (streamable HTTP) or ``command`` (a stdio subprocess).

    ``headers`` and ``env`` may hold secrets (tokens, kubeconfigs): they are
    ``SecretStr`` and ``args`` stay out of ``repr``. Its secrets (:meth:`secrets`) are
    the header values and what ``${VAR}`` put in any of its values (the file's reader
    says which, through the validation context ``{"substituted": {value: "${VAR}"}}``);
    they are redacted from what its server answers and every message we build
    (``redact``). A plain ``env: {TZ_MODE: time}`` is no secret: it is in the file.
    ``tools``, when given, is the allowlist of the server's tool names. ``auth`` (HTTP
    only): OAuth (:class:`McpAuth`); its ``client_secret`` is a secret too.
    """

    url: str | None = None
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list, repr=False)
    env: dict[str, SecretStr] = Field(default_factory=dict)
    tools: list[str] | None = None  # the allowlist; None: every tool the server lists
    auth: McpAuth | None = None
    # How long a question the server asks mid-call waits for the requester's answer
    # (elicitation): in-session (``elicitation/create``, the session held open meanwhile),
    # and as a 2026-07-28 ``InputRequiredResult`` (nothing held open: the call is sent again).
    elicitation_timeout: Duration = ELICITATION_TIMEOUT_S
    input_required_timeout: Duration = INPUT_REQUIRED_TIMEOUT_S
    _substituted: tuple[str, ...] = PrivateAttr(default=())  # what ${VAR} put in its values
    # What OAuth gave this process (tokens, a registered client's secret): the latest few.
    _obtained: dict[str, None] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _note_substituted(self, info: ValidationInfo) -> McpServerConfig:
        filled: Any = (info.context or {}).get("substituted") or {}
        values = [
            *self.plain_headers().values(),
            *self.plain_env().values(),
            *self.args,
            self.url or "",
            self.command or "",
            *(
                self.auth.model_dump(
                    exclude={"client_secret", "private_key", "admins"}, exclude_none=True
                ).values()
                if self.auth is not None
                else ()
            ),
        ]
        self._substituted = tuple(v for v in filled if v and any(v in f for f in values))
        return self

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if self.url is not None and self.command is not None:
            raise ValueError("give either url or command, not both")
        if self.url is None and self.command is None:
            raise ValueError("give url (streamable HTTP) or command (stdio)")
        if self.url is not None:
            if urlsplit(self.url).scheme not in ("http", "https"):
                raise KeyProblem(("url",), f"must be an http or https URL, not {self.url!r}")
            if self.args or self.env:
                raise ValueError("args and env go with command, not url")
        elif self.headers:
            raise ValueError("headers go with url, not command")
        elif self.auth is not None:
            raise ValueError("auth goes with url, not command")
        return self

    @property
    def transport(self) -> str:
        return "http" if self.url is not None else "stdio"

    def plain_headers(self) -> dict[str, str]:
        return plain(self.headers)

    def plain_env(self) -> dict[str, str]:
        return plain(self.env)

    def secrets(self) -> list[str]:
        """Every header value, the OAuth client secret and the tokens OAuth gave
        (:meth:`obtained`), and every value ``${VAR}`` put in (what logs mask too)."""
        auth = self.auth
        keys = (auth.plain_secret() or "", auth.plain_key() or "") if auth is not None else ()
        found = (*self.plain_headers().values(), *self._substituted, *keys, *self._obtained)
        return sorted({v for v in found if v})

    def obtained(self, secret: str) -> None:
        """A secret OAuth gave (an access or refresh token): redacted like the others.
        The latest :data:`KEPT_OBTAINED` are kept (older tokens have expired)."""
        if not secret:
            return
        self._obtained.pop(secret, None)
        self._obtained[secret] = None
        while len(self._obtained) > KEPT_OBTAINED:
            del self._obtained[next(iter(self._obtained))]

    def redact(self, text: str) -> str:
        """``text`` with each secret of :meth:`secrets` (4 characters or more) as ``***``."""
        found = (v for v in self.secrets() if len(v) >= MIN_SECRET)
        for value in sorted(found, key=len, reverse=True):  # a secret holding another: whole
            text = text.replace(value, "***")
        return text
