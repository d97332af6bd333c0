"""OAuth for HTTP MCP servers (``auth:`` of ``tools.mcp.<server>``), through the SDK's client.

The SDK's providers (``mcp.client.auth``) do the protocol: on a 401 they discover the
protected resource and its authorization server, register when there is no client,
get a token, refresh it, and step up a scope on a 403 ``insufficient_scope``. What is
opsloop's is where their state lives and how a person takes part:

* Tokens, a dynamic registration and a pending authorization live in the database
  (``mcp_oauth``, one row per server, through :class:`OAuthRecords`: the store), so
  every replica and every restart shares them; a token one replica refreshed is the
  next one's, and the expiry is kept as a time, not as seconds from an answer.
* ``client_credentials`` needs no person. ``authorization_code`` does, and opsloop
  cannot open a browser: the first connect that needs it asks for an authorization
  (its ``state``, PKCE verifier and link, kept in the row), logs one line naming the
  server and saying that ``opsloop doctor`` shows the link to an admin, and fails as
  :class:`AuthorizationPending` (the server is down, retried in the background). The
  admin opens the link (serve also posts it privately to the server's ``admins``,
  through ``on_authorization_needed``: :class:`Announcing`); the authorization server
  sends the browser to
  ``redirect_url``, serve's ``GET /oauth/callback`` (bot/oauth_callback.py), which keeps
  the ``code`` for the waiting ``state``; the next connect, on whatever replica, takes
  it once and exchanges it. Later tries reuse the link while it stands, so the link an
  admin holds stays good.

The rows' ``binding`` is a hash of what the credentials are for (the URL, the grant,
the client): a configuration that changes them starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider, OAuthFlowError, PKCEParameters
from mcp.client.auth.exceptions import OAuthRegistrationError, OAuthTokenError
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.utils import validate_authorization_response_iss
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPDeprecationWarning

from tools.mcp.config import McpAuth, McpServerConfig
from tools.mcp.oauth_record import McpOAuthRecord, TakenCode

log = logging.getLogger("tools.mcp.source")  # the source's lines: one logger to filter

# An authorization nobody completed within this is asked for again (a new link): an
# authorization server forgets a request long before.
PENDING_TTL = timedelta(days=1)
_GRANTS = ["authorization_code", "refresh_token"]
_OAUTH_ERRORS = (OAuthFlowError, OAuthTokenError, OAuthRegistrationError)
PENDING = "an admin must authorize opsloop first (`opsloop doctor` shows the link)"
# What a serving process does with a new link an admin must open (bot/oauth_notice.py
# posts it to them): (server, link, until when it is used, the server's ``admins``).
AuthorizationNeeded = Callable[[str, str, datetime, Sequence[str]], Awaitable[None]]
_COLUMNS = (
    "server binding tokens expires_at client_info pending_state pending_verifier "
    "pending_url pending_since code iss updated_at"
).split()


class OAuthRecords(Protocol):
    """The store's MCP OAuth verbs (``engine.store.Store`` has them)."""

    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None: ...

    async def upsert_mcp_tokens(
        self,
        server: str,
        binding: str,
        tokens: str | None,
        expires_at: datetime | None,
        now: datetime,
    ) -> None: ...

    async def upsert_mcp_client(
        self, server: str, binding: str, client_info: str, now: datetime
    ) -> None: ...

    async def upsert_mcp_pending(
        self, server: str, binding: str, state: str, verifier: str, url: str, now: datetime
    ) -> None: ...

    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None: ...

    async def delete_mcp_oauth(self, server: str) -> None: ...


class AuthorizationPending(OAuthFlowError):
    """The server needs an admin to authorize opsloop first (the link is asked for)."""


def binding(server: McpServerConfig) -> str:
    """What stored credentials are for: another URL, grant or client voids them (a new
    client secret does not)."""
    auth = server.auth
    assert auth is not None
    # Defaults left out: a field a later release adds does not void every stored token.
    # Whom a link is posted to says nothing of what the credentials are for.
    kept = auth.model_dump(
        exclude={"client_secret", "private_key", "admins"}, exclude_defaults=True
    )
    facts = [server.url, *kept.items()]
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class StoredTokens:
    """The SDK's ``TokenStorage`` over one server's row. A token comes back with
    ``expires_in`` counted from now (the row keeps when it expires)."""

    records: OAuthRecords
    server: str
    binding: str
    seen: Callable[[str], None] = lambda secret: None  # each token, to redact it

    def _saw(self, tokens: OAuthToken) -> None:
        self.seen(tokens.access_token)
        self.seen(tokens.refresh_token or "")

    async def row(self) -> McpOAuthRecord | None:
        """The server's row, unless it belongs to another configuration (then gone)."""
        row = await self.records.select_mcp_oauth(self.server)
        if row is not None and row.binding != self.binding:
            await self.records.delete_mcp_oauth(self.server)
            return None
        return row

    async def get_tokens(self) -> OAuthToken | None:
        row = await self.row()
        if row is None or row.tokens is None:
            return None
        token = OAuthToken.model_validate_json(row.tokens)
        self._saw(token)
        if row.expires_at is not None:
            left = (row.expires_at - _now()).total_seconds()
            token = token.model_copy(update={"expires_in": max(0, int(left))})
        return token

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self._saw(tokens)
        now = _now()
        expires = None if tokens.expires_in is None else now + timedelta(seconds=tokens.expires_in)
        await self.records.upsert_mcp_tokens(
            self.server, self.binding, tokens.model_dump_json(exclude_none=True), expires, now
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        row = await self.row()
        if row is None or row.client_info is None:
            return None
        client = OAuthClientInformationFull.model_validate_json(row.client_info)
        self.seen(client.client_secret or "")
        return client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.seen(client_info.client_secret or "")
        text = client_info.model_dump_json(exclude_none=True)
        await self.records.upsert_mcp_client(self.server, self.binding, text, _now())

    async def forget_tokens(self) -> None:
        """The tokens were refused for good (a refresh token the server no longer takes)."""
        await self.records.upsert_mcp_tokens(self.server, self.binding, None, None, _now())

    async def ask(self, state: str, verifier: str, url: str) -> None:
        await self.records.upsert_mcp_pending(
            self.server, self.binding, state, verifier, url, _now()
        )

    async def take_code(self, state: str) -> TakenCode | None:
        return await self.records.take_mcp_code(self.server, state, _now())


@dataclass
class MemoryRecords:
    """:class:`OAuthRecords` in memory: a process without a database (tests), or the
    writes of one that must not change the database (:class:`ReadingRecords`)."""

    rows: dict[str, McpOAuthRecord] = field(default_factory=dict)

    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None:
        return self.rows.get(server)

    def _put(self, server: str, binding: str, now: datetime, **values: Any) -> None:
        empty = dict.fromkeys(_COLUMNS[2:-1])
        row = self.rows.get(server) or McpOAuthRecord(server, binding, updated_at=now, **empty)
        self.rows[server] = replace(row, binding=binding, updated_at=now, **values)

    async def upsert_mcp_tokens(
        self,
        server: str,
        binding: str,
        tokens: str | None,
        expires_at: datetime | None,
        now: datetime,
    ) -> None:
        self._put(server, binding, now, tokens=tokens, expires_at=expires_at)

    async def upsert_mcp_client(
        self, server: str, binding: str, client_info: str, now: datetime
    ) -> None:
        self._put(server, binding, now, client_info=client_info)

    async def upsert_mcp_pending(
        self, server: str, binding: str, state: str, verifier: str, url: str, now: datetime
    ) -> None:
        pending = {"pending_verifier": verifier, "pending_url": url, "pending_since": now}
        self._put(server, binding, now, pending_state=state, code=None, iss=None, **pending)

    async def answer_mcp_pending(
        self, state: str, code: str, iss: str | None, now: datetime
    ) -> str | None:
        for row in self.rows.values():
            if row.pending_state == state and row.code is None:
                self.rows[row.server] = replace(row, code=code, iss=iss, updated_at=now)
                return row.server
        return None

    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None:
        row = self.rows.get(server)
        if row is None or row.pending_state != state or row.code is None:
            return None
        self.rows[server] = replace(
            row,
            code=None,
            iss=None,
            pending_state=None,
            pending_verifier=None,
            pending_url=None,
            pending_since=None,
        )
        return row.code, row.iss, row.pending_verifier

    async def delete_mcp_oauth(self, server: str) -> None:
        self.rows.pop(server, None)


class ReadingRecords(MemoryRecords):
    """The database's rows, read; what this process gets (a token) kept in memory only.
    ``opsloop doctor`` and ``opsloop tools`` use the tokens serve keeps, and never ask
    for an authorization themselves (that would void the link an admin holds)."""

    def __init__(self, records: OAuthRecords) -> None:
        super().__init__()
        self._db = records

    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None:
        return self.rows.get(server) or await self._db.select_mcp_oauth(server)

    async def upsert_mcp_pending(self, *args: Any) -> None:
        raise AuthorizationPending(
            "no authorization was asked for yet: `opsloop serve` asks for one, and "
            "`opsloop doctor` then shows its link"
        )

    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None:
        return None  # serve takes it

    async def delete_mcp_oauth(self, server: str) -> None:
        self.rows.pop(server, None)


@dataclass
class Announcing:
    """``records`` (:class:`OAuthRecords`) that tell ``on_needed`` of each new link
    they record, once it is stored (an admin who opens it at once finds it waiting).
    A link reused by later tries is not told again; one another replica replaced
    meanwhile is that replica's to tell. Whatever ``on_needed`` does, the connect goes
    on as it would have: the link stays on ``opsloop doctor``."""

    records: OAuthRecords
    admins: tuple[str, ...]
    on_needed: AuthorizationNeeded

    async def select_mcp_oauth(self, server: str) -> McpOAuthRecord | None:
        return await self.records.select_mcp_oauth(server)

    async def upsert_mcp_tokens(
        self,
        server: str,
        binding: str,
        tokens: str | None,
        expires_at: datetime | None,
        now: datetime,
    ) -> None:
        await self.records.upsert_mcp_tokens(server, binding, tokens, expires_at, now)

    async def upsert_mcp_client(
        self, server: str, binding: str, client_info: str, now: datetime
    ) -> None:
        await self.records.upsert_mcp_client(server, binding, client_info, now)

    async def upsert_mcp_pending(
        self, server: str, binding: str, state: str, verifier: str, url: str, now: datetime
    ) -> None:
        await self.records.upsert_mcp_pending(server, binding, state, verifier, url, now)
        row = await self.records.select_mcp_oauth(server)
        if row is None or row.pending_state != state:
            return
        try:
            await self.on_needed(server, url, now + PENDING_TTL, self.admins)
        except Exception as exc:  # a notice never fails the connect; no text: it may hold the link
            log.warning(
                "mcp authorization link not posted server=%s error=%s: `opsloop doctor` shows it",
                server,
                type(exc).__name__,
            )

    async def take_mcp_code(self, server: str, state: str, now: datetime) -> TakenCode | None:
        return await self.records.take_mcp_code(server, state, now)

    async def delete_mcp_oauth(self, server: str) -> None:
        await self.records.delete_mcp_oauth(server)


def announcing(
    records: OAuthRecords, server: McpServerConfig, on_needed: AuthorizationNeeded | None
) -> OAuthRecords:
    """``records``, telling ``on_needed`` of each new link when ``server`` names admins
    to post it to (``auth: {type: authorization_code, admins: [...]}``)."""
    auth = server.auth
    if on_needed is None or auth is None or auth.type != "authorization_code" or not auth.admins:
        return records
    return Announcing(records, tuple(dict.fromkeys(auth.admins)), on_needed)


async def pending_link(records: OAuthRecords, name: str, server: McpServerConfig) -> str | None:
    """The link an admin opens to authorize opsloop for ``server``, while one is asked."""
    row = await records.select_mcp_oauth(name)
    if row is None or row.binding != binding(server) or row.code is not None:
        return None
    return row.pending_url


class _FromStore:
    """What both providers add to the SDK's: the expiry a stored token had, and a
    refresh that lost a race to another replica (which rotated the refresh token)
    taking that replica's token instead of asking for a new authorization."""

    context: Any

    async def _initialize(self) -> None:
        await super()._initialize()  # type: ignore[misc]
        tokens = self.context.current_tokens
        if tokens is not None and tokens.expires_in is not None:
            self.context.update_token_expiry(tokens)

    async def _handle_refresh_response(self, response: httpx2.Response) -> bool:
        had = self.context.current_tokens
        if await super()._handle_refresh_response(response):  # type: ignore[misc]
            return True
        stored = await self.context.storage.get_tokens()
        if stored is None or had is None or stored.access_token == had.access_token:
            await self.context.storage.forget_tokens()  # the next connect does not retry it
            return False
        self.context.current_tokens = stored
        if stored.expires_in is not None:
            self.context.update_token_expiry(stored)
        return self.context.is_token_valid()


class ClientCredentials(_FromStore, ClientCredentialsOAuthProvider):
    """``type: client_credentials``: the SDK's provider, tokens in the database."""


class ClientAssertion(_FromStore, PrivateKeyJWTOAuthProvider):
    """``type: client_credentials`` with ``private_key``: a signed JWT instead of a secret."""


class AuthorizationCode(_FromStore, OAuthClientProvider):
    """``type: authorization_code``: the SDK's provider, whose one step that needs a
    person (open the link, come back with a code) is asked of an admin and answered
    through the database instead of a browser on this machine (see the module)."""

    def __init__(self, name: str, server_url: str, auth: McpAuth, storage: StoredTokens):
        assert auth.redirect_url is not None
        metadata = OAuthClientMetadata(
            redirect_uris=[auth.redirect_url],  # type: ignore[list-item]
            grant_types=list(_GRANTS),
            token_endpoint_auth_method=auth.auth_method,  # type: ignore[arg-type]
            scope=auth.scope,
            client_name="opsloop",
            application_type="web",
        )
        super().__init__(
            server_url, metadata, storage, client_metadata_url=auth.client_metadata_url
        )
        self._name = name
        self._auth = auth
        self._stored = storage
        self._refreshing = False  # the token request in flight is a refresh
        self._refreshed: str | None = None  # the access token a refresh for a refusal gave

    async def _initialize(self) -> None:
        await super()._initialize()
        auth = self._auth
        if auth.client_id is not None:  # pre-registered: never a dynamic registration
            self.context.client_info = OAuthClientInformationFull(
                client_id=auth.client_id,
                client_secret=auth.plain_secret(),
                redirect_uris=[auth.redirect_url],  # type: ignore[list-item]
                grant_types=list(_GRANTS),
                token_endpoint_auth_method=auth.auth_method,
                scope=auth.scope,
            )

    async def _perform_authorization(self) -> httpx2.Request:
        """The token request for the code an admin's authorization brought; until
        there is one, :class:`AuthorizationPending` (asking for it, once per link)."""
        row = await self._stored.row()
        if row is not None and row.pending_state is not None and row.code is not None:
            taken = await self._stored.take_code(row.pending_state)
            if taken is not None:
                code, iss, verifier = taken
                validate_authorization_response_iss(iss, self.context.oauth_metadata)
                return await self._exchange_token_authorization_code(code, verifier or "")
        had = self.context.current_tokens
        stored = await self._stored.get_tokens()
        if stored is not None and (had is None or stored.access_token != had.access_token):
            # Another replica completed it meanwhile: its token serves the next connect.
            raise AuthorizationPending("authorized meanwhile (another replica): connecting again")
        if self._may_refresh():
            # A token refused before it expired (a server's clock, a revoked access
            # token): the refresh token may still be good, and then no admin is needed.
            self._refreshing = True
            return await self._refresh_token()
        await self._ask(row)
        raise AuthorizationPending(PENDING)

    def _may_refresh(self) -> bool:
        """With a refresh token, for no wider scope than it has, unless the token refused
        is the one such a refresh just gave (then only an admin can help)."""
        tokens = self.context.current_tokens
        if tokens is None or not tokens.refresh_token or tokens.access_token == self._refreshed:
            return False
        wanted = set((self.context.client_metadata.scope or "").split())
        return wanted <= set((tokens.scope or "").split())

    async def _handle_token_response(self, response: httpx2.Response) -> None:
        if not self._refreshing:
            await super()._handle_token_response(response)
            return
        self._refreshing = False
        if not await self._handle_refresh_response(response):
            await self._ask(await self._stored.row())
            raise AuthorizationPending(PENDING)
        self._refreshed = self.context.current_tokens.access_token

    async def _ask(self, row: McpOAuthRecord | None) -> None:
        """Ask an admin for an authorization, unless the link asked before still does."""
        link = row.pending_url if row is not None else None
        since = row.pending_since if row is not None else None
        if link is None or since is None or _now() - since > PENDING_TTL or not self._same(link):
            link, state, verifier = self._authorization_request()
            await self._stored.ask(state, verifier, link)
            log.warning(
                "mcp server needs authorization server=%s: an admin opens the link "
                "`opsloop doctor` shows (it returns to %s)",
                self._name,
                self._auth.redirect_url,
            )

    def _params(self) -> dict[str, str]:
        """The authorization request, as the SDK's ``_perform_authorization_code_grant``
        makes it, but for its ``state`` and PKCE challenge."""
        ctx = self.context
        assert ctx.client_info is not None and ctx.client_metadata.redirect_uris
        params = {
            "response_type": "code",
            "client_id": ctx.client_info.client_id,
            "redirect_uri": str(ctx.client_metadata.redirect_uris[0]),
            "code_challenge_method": "S256",
        }
        if ctx.should_include_resource_param(ctx.protocol_version):
            params["resource"] = ctx.get_resource_url()  # RFC 8707
        if ctx.client_metadata.scope:
            params["scope"] = ctx.client_metadata.scope
            if "offline_access" in ctx.client_metadata.scope.split():
                params["prompt"] = "consent"  # OIDC asks it with offline_access
        return params

    def _endpoint(self) -> str:
        ctx = self.context
        if ctx.oauth_metadata and ctx.oauth_metadata.authorization_endpoint:
            return str(ctx.oauth_metadata.authorization_endpoint)
        return urljoin(ctx.get_authorization_base_url(ctx.server_url), "/authorize")

    def _authorization_request(self) -> tuple[str, str, str]:
        """A new link, its state and its PKCE verifier."""
        pkce = PKCEParameters.generate()
        state = secrets.token_urlsafe(32)
        params = {**self._params(), "state": state, "code_challenge": pkce.code_challenge}
        return f"{self._endpoint()}?{urlencode(params)}", state, pkce.code_verifier

    def _same(self, link: str) -> bool:
        """Does the link asked before ask what a new one would (client, scope, resource)?"""
        parts = urlsplit(link)
        asked = {k: v[0] for k, v in parse_qs(parts.query).items()}
        for fresh in ("state", "code_challenge"):
            asked.pop(fresh, None)
        return parts._replace(query="").geturl() == self._endpoint() and asked == self._params()


def provider(name: str, server: McpServerConfig, records: OAuthRecords) -> httpx2.Auth:
    """The SDK provider for ``server``'s ``auth:``, its state in ``records``."""
    auth = server.auth
    assert auth is not None and server.url is not None
    storage = StoredTokens(records, name, binding(server), server.obtained)
    if auth.type == "authorization_code":
        return AuthorizationCode(name, server.url, auth, storage)
    assert auth.client_id is not None
    with warnings.catch_warnings():
        # Without an issuer the SDK warns that it is to be required; the README says
        # what setting one guards against.
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        if (key := auth.plain_key()) is not None:
            signed = SignedJWTParameters(
                issuer=auth.client_id,
                subject=auth.client_id,
                signing_key=key,
                signing_algorithm=auth.signing_algorithm,
            )
            return ClientAssertion(
                server.url,
                storage,
                auth.client_id,
                signed.create_assertion_provider(),
                scope=auth.scope,
                issuer=auth.issuer,
            )
        return ClientCredentials(
            server.url,
            storage,
            auth.client_id,
            auth.plain_secret() or "",
            token_endpoint_auth_method=(
                "client_secret_post"
                if auth.auth_method == "client_secret_post"
                else "client_secret_basic"
            ),
            scope=auth.scope,
            issuer=auth.issuer,
        )


def auth_failure(exc: BaseException) -> BaseException | None:
    """The OAuth error inside ``exc`` (exception groups), if that is what it is."""
    todo = [exc]
    while todo:
        found = todo.pop()
        if isinstance(found, _OAUTH_ERRORS):
            return found
        if isinstance(found, BaseExceptionGroup):
            todo.extend(found.exceptions)
        elif found.__cause__ is not None:
            todo.append(found.__cause__)
    return None


class _OneLine(logging.Filter):
    """The SDK logs every flow that ends without a token with its traceback; the source
    says why in one line (and waiting for an admin is no failure). A bug keeps its
    traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _OAUTH_ERRORS)


logging.getLogger("mcp.client.auth.oauth2").addFilter(_OneLine())
