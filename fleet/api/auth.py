"""`Authorization: Token <key>` against hashed keys.

Every request reads the token, its user and the user's memberships with their teams in one
indexed query (the permission check and most endpoints need the memberships next), and
nothing of it is kept between requests: a token replaced or deleted, a user deactivated or
removed from a team stops counting at the next request."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Field, Model
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from fleet.models import ApiToken, Membership, Team
from fleet.services.tokens import hash_key

INVALID = "Invalid token; create a new one with POST /api/v1/tokens/ or `add_user`."
# The token's last use is written at most this often (one UPDATE a minute, not per request).
LAST_USED_EVERY_S = 60


class _Columns:
    """One model's columns in a joined SELECT: their SQL, and how to build the instance
    from its slice of a row (with the field converters the ORM would apply)."""

    def __init__(self, model: type[Model], alias: str) -> None:
        fields = model._meta.concrete_fields
        quote = connection.ops.quote_name
        self.model = model
        self.sql = ", ".join(f"{alias}.{quote(f.column)}" for f in fields)
        self.width = len(fields)
        self.names = [f.attname for f in fields]
        self.converters: list[tuple[int, Callable[..., Any], Any]] = []
        for i, field in enumerate(fields):
            col = field.get_col(alias)
            for conv in connection.ops.get_db_converters(col) + col.get_db_converters(connection):
                self.converters.append((i, conv, col))

    def build(self, row: tuple[Any, ...], start: int) -> Any:
        values = list(row[start : start + self.width])
        for i, conv, col in self.converters:
            values[i] = conv(values[i], col, connection)
        return self.model.from_db(connection.alias, self.names, values)


@cache
def _token_query() -> tuple[str, tuple[_Columns, ...]]:
    user_model = get_user_model()
    parts = (
        _Columns(ApiToken, "t"),
        _Columns(user_model, "u"),
        _Columns(Membership, "m"),
        _Columns(Team, "tm"),
    )
    quote = connection.ops.quote_name

    def col(alias: str, model: type[Model], name: str) -> str:
        field = model._meta.get_field(name)
        assert isinstance(field, Field) and field.column
        return f"{alias}.{quote(field.column)}"

    def table(model: type[Model]) -> str:
        return quote(model._meta.db_table)

    sql = (
        f"SELECT {', '.join(p.sql for p in parts)} FROM {table(ApiToken)} t "
        f"JOIN {table(user_model)} u ON {col('u', user_model, 'id')} = {col('t', ApiToken, 'user')} "
        f"LEFT JOIN {table(Membership)} m ON {col('m', Membership, 'user')} = {col('u', user_model, 'id')} "
        f"LEFT JOIN {table(Team)} tm ON {col('tm', Team, 'id')} = {col('m', Membership, 'team')} "
        f"WHERE {col('t', ApiToken, 'key_hash')} = %s ORDER BY {col('m', Membership, 'id')}"
    )  # fmt: skip
    return sql, parts


def token_holder(key_hash: str) -> ApiToken | None:
    """The token with this hash, its user loaded, and the user's memberships with their
    teams read with them (as fleet.services.access.memberships_of keeps them): one query."""
    sql, (token_cols, user_cols, member_cols, team_cols) = _token_query()
    with connection.cursor() as cursor:
        cursor.execute(sql, [key_hash])
        rows = cursor.fetchall()
    if not rows:
        return None
    token = token_cols.build(rows[0], 0)
    user = user_cols.build(rows[0], token_cols.width)
    start = token_cols.width + user_cols.width
    memberships = []
    for row in rows:
        if row[start] is None:  # no membership: the LEFT JOIN's empty row
            continue
        membership = member_cols.build(row, start)
        membership.team = team_cols.build(row, start + member_cols.width)
        memberships.append(membership)
    user._fleet_memberships = memberships
    token.user = user
    return token


class HashedTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header; send 'Authorization: Token <key>'."
            )
        try:
            key = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.")
        token = token_holder(hash_key(key))
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed(INVALID)
        now = timezone.now()
        if (
            token.last_used_at is None
            or (now - token.last_used_at).total_seconds() > LAST_USED_EVERY_S
        ):
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword


class HashedTokenScheme(OpenApiAuthenticationExtension):
    target_class = "fleet.api.auth.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "Token-based authentication: `Token <key>`.",
        }
