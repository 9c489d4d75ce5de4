"""The double-entry ledger: accounts, balanced transactions with idempotency keys, cached balances,
and the check that proves them (invariant 9, docs/architecture.md).

Signs: an account's balance is the sum of its entries. A user's cash goes up with a top-up and down
with usage; a provider's earnings go up with usage (pending), move to available after the hold, and
go down with a payout. The platform's top-up and payout accounts are the outside world's side, so
they run negative and positive; its fee account collects the fee and the rounding remainder."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, bindparam, column, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import new_id
from sxwl.cloud.db.money_models import (
    LedgerAccount,
    LedgerEntry,
    LedgerTransaction,
    StorageCharge,
    UsageLine,
)
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError

USER_CASH = "user_cash"
PROVIDER_PENDING = "provider_pending"
PROVIDER_AVAILABLE = "provider_available"
PLATFORM_FEES = "platform_fees"
PLATFORM_TOP_UPS = "platform_top_ups"
PLATFORM_PAYOUTS = "platform_payouts"
# What saved dev environment workspaces earned the platform, which stores them (no provider's share).
PLATFORM_STORAGE = "platform_storage"
_OWNED = frozenset({USER_CASH, PROVIDER_PENDING, PROVIDER_AVAILABLE})


def account_key(kind: str, owner_id: str | None = None) -> str:
    if (kind in _OWNED) != (owner_id is not None):
        raise ValueError(f"account kind {kind} {'needs' if kind in _OWNED else 'takes no'} owner")
    return f"{kind}:{owner_id or ''}"


def _kind_and_owner(key: str) -> tuple[str, str | None]:
    kind, _, owner = key.partition(":")
    return kind, owner or None


class Unbalanced(ValueError):
    pass


@dataclass
class Posting:
    """A transaction to post: its entries by account key, and the columns a statement shows."""

    idempotency_key: str
    kind: str
    entries: Mapping[str, int]
    fields: dict[str, Any] = field(default_factory=dict)


def account_ids(session: Session, keys: Iterable[str]) -> dict[str, int]:
    """The ids of the accounts ``keys``, creating those that do not exist yet (also when another
    transaction creates the same one at the same moment)."""
    wanted = set(keys)
    if not wanted:
        return {}
    found = dict(
        session.execute(
            select(LedgerAccount.key, LedgerAccount.id).where(LedgerAccount.key.in_(wanted))
        ).all()
    )
    missing = sorted(wanted - found.keys())
    if missing:
        rows = [
            {"key": key, "kind": _kind_and_owner(key)[0], "owner_id": _kind_and_owner(key)[1], "balance": 0}
            for key in missing
        ]
        dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        session.execute(dialect.insert(LedgerAccount).on_conflict_do_nothing(index_elements=["key"]), rows)
        found.update(
            session.execute(
                select(LedgerAccount.key, LedgerAccount.id).where(LedgerAccount.key.in_(missing))
            ).all()
        )
    return found


_ACCOUNTS_TABLE: Table = LedgerAccount.__table__  # type: ignore[assignment]  # a mapped class's table
_TRANSACTIONS_TABLE: Table = LedgerTransaction.__table__  # type: ignore[assignment]
_ENTRIES_TABLE: Table = LedgerEntry.__table__  # type: ignore[assignment]
_ADD_TO_BALANCE = (
    update(_ACCOUNTS_TABLE)
    .where(_ACCOUNTS_TABLE.c.id == bindparam("b_id"))
    .values(balance=_ACCOUNTS_TABLE.c.balance + bindparam("b_delta"))
)


def post_many(session: Session, postings: Sequence[Posting]) -> list[str]:
    """Writes ``postings`` in a few statements: transactions, entries, one balance update per
    account (in id order, so concurrent posters never wait on each other in a cycle); returns the
    transactions' ids, in order. A repeated idempotency key fails the whole unit of work
    (IntegrityError): the caller decides what that means; ``post`` turns it into "already posted"."""
    if not postings:
        return []
    for posting in postings:
        if sum(posting.entries.values()) != 0:
            raise Unbalanced(f"transaction {posting.idempotency_key} does not sum to zero")
    ids = account_ids(session, {key for p in postings for key in p.entries})
    now = utcnow()
    tx_rows: list[dict[str, Any]] = []
    entry_rows: list[dict[str, Any]] = []
    deltas: dict[int, int] = defaultdict(int)
    for posting in postings:
        tx_id = new_id()
        tx_rows.append(
            {
                "id": tx_id,
                "idempotency_key": posting.idempotency_key,
                "kind": posting.kind,
                "created_at": posting.fields.get("created_at", now),
                "gross": 0,
                "fee": 0,
                "net": 0,
                **{k: v for k, v in posting.fields.items() if k != "created_at"},
            }
        )
        for key, amount in posting.entries.items():
            if amount:
                entry_rows.append({"transaction_id": tx_id, "account_id": ids[key], "amount": amount})
                deltas[ids[key]] += amount
    insert_rows(session, _TRANSACTIONS_TABLE, _same_keys(tx_rows))
    if entry_rows:
        insert_rows(session, _ENTRIES_TABLE, entry_rows)
    changed = [{"b_id": account, "b_delta": delta} for account, delta in sorted(deltas.items()) if delta]
    if changed:
        session.execute(_ADD_TO_BALANCE, changed)
    return [row["id"] for row in tx_rows]


def insert_rows(session: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """Inserts ``rows`` (all naming the same columns). On PostgreSQL they travel as one array per
    column, unnested into rows by the server: one statement, where an executemany costs the server a
    statement per row."""
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(table), rows)
        return
    columns = [table.c[name] for name in sorted(rows[0])]
    unnested = (
        func.unnest(*(bindparam(f"b_{c.name}", type_=postgresql.ARRAY(c.type)) for c in columns))
        .table_valued(*(column(c.name, c.type) for c in columns))
        .render_derived(name="given")
    )
    session.execute(
        insert(table).from_select([c.name for c in columns], select(*unnested.c)),
        {f"b_{c.name}": [row[c.name] for row in rows] for c in columns},
    )


def _same_keys(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An executemany needs every row to name the same columns."""
    columns = {key for row in rows for key in row}
    return [{column: row.get(column) for column in columns} for row in rows]


def post(session: Session, posting: Posting) -> bool:
    """Posts one transaction; False when its idempotency key was posted before (nothing changes)."""
    if session.scalar(
        select(LedgerTransaction.id).where(LedgerTransaction.idempotency_key == posting.idempotency_key)
    ):
        return False
    try:
        with session.begin_nested():
            post_many(session, [posting])
    except IntegrityError:
        return False
    return True


def replayed(
    session: Session, key: str, *, owner_id: str, amount: int, what: str
) -> LedgerTransaction | None:
    """The transaction an admin's retried request (same idempotency ``key``) already posted, or
    None; 409 when the key was used for a different owner or amount."""
    done = session.scalar(select(LedgerTransaction).where(LedgerTransaction.idempotency_key == key))
    if done is not None and (owner_id not in (done.payer_id, done.provider_id) or done.gross != amount):
        raise AppError(409, f"this idempotency key was used for another {what}", code="idempotency_conflict")
    return done


def balance(session: Session, key: str) -> int:
    """The cached balance of an account (0 for one that has no entries yet)."""
    return session.scalar(select(LedgerAccount.balance).where(LedgerAccount.key == key)) or 0


def balances(session: Session, kind: str, owner_ids: Iterable[str]) -> dict[str, int]:
    keys = [account_key(kind, owner) for owner in owner_ids]
    return {
        _kind_and_owner(key)[1] or "": value
        for key, value in session.execute(
            select(LedgerAccount.key, LedgerAccount.balance).where(LedgerAccount.key.in_(keys))
        )
    }


@dataclass(frozen=True)
class CheckReport:
    transactions: int
    entries: int
    unbalanced: list[str]  # idempotency keys of transactions whose entries do not sum to zero
    mismatched: list[tuple[str, int, int]]  # (account key, cached balance, sum of its entries)
    unlined: list[str]  # usage (storage) transactions whose lines (charge row) differ in gross or net

    @property
    def ok(self) -> bool:
        return not self.unbalanced and not self.mismatched and not self.unlined


def check(session: Session) -> CheckReport:
    """Proves the ledger: every transaction sums to zero, every cached balance equals its entries,
    every usage transaction's lines (what statements list) add up to what it charged and
    credited, and every storage transaction's charge row to what it charged. Aggregates in the
    database; reads no row it does not report."""
    transactions = session.scalar(select(func.count()).select_from(LedgerTransaction)) or 0
    entries = session.scalar(select(func.count()).select_from(LedgerEntry)) or 0
    per_tx = (
        select(LedgerEntry.transaction_id, func.sum(LedgerEntry.amount).label("total"))
        .group_by(LedgerEntry.transaction_id)
        .subquery()
    )
    unbalanced = list(
        session.scalars(
            select(LedgerTransaction.idempotency_key)
            .join(per_tx, per_tx.c.transaction_id == LedgerTransaction.id)
            .where(per_tx.c.total != 0)
        )
    )
    per_account = (
        select(LedgerEntry.account_id, func.sum(LedgerEntry.amount).label("total"))
        .group_by(LedgerEntry.account_id)
        .subquery()
    )
    total = func.coalesce(per_account.c.total, 0)
    mismatched = [
        (key, cached, int(summed))
        for key, cached, summed in session.execute(
            select(LedgerAccount.key, LedgerAccount.balance, total)
            .outerjoin(per_account, per_account.c.account_id == LedgerAccount.id)
            .where(LedgerAccount.balance != total)
        )
    ]
    per_usage = (
        select(
            UsageLine.transaction_id,
            func.sum(UsageLine.gross).label("gross"),
            func.sum(UsageLine.net).label("net"),
        )
        .group_by(UsageLine.transaction_id)
        .subquery()
    )
    unlined = list(
        session.scalars(
            select(LedgerTransaction.idempotency_key)
            .outerjoin(per_usage, per_usage.c.transaction_id == LedgerTransaction.id)
            .where(
                LedgerTransaction.kind == "usage",
                (func.coalesce(per_usage.c.gross, -1) != LedgerTransaction.gross)
                | (func.coalesce(per_usage.c.net, -1) != LedgerTransaction.net),
            )
        )
    )
    per_storage = (
        select(StorageCharge.transaction_id, func.sum(StorageCharge.gross).label("gross"))
        .group_by(StorageCharge.transaction_id)
        .subquery()
    )
    unlined += session.scalars(  # a saved workspace's day: its charge row says what it charged
        select(LedgerTransaction.idempotency_key)
        .outerjoin(per_storage, per_storage.c.transaction_id == LedgerTransaction.id)
        .where(
            LedgerTransaction.kind == "storage",
            func.coalesce(per_storage.c.gross, -1) != LedgerTransaction.gross,
        )
    )
    return CheckReport(transactions, entries, unbalanced, mismatched, unlined)
