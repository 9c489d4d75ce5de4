"""Which replica holds a CPod's tunnel connections (docs/tunnel.md): a request that reaches another
replica is relayed to one that holds them. One row per live process (renewed while it runs, so the
fleet's rows are not rewritten every renewal), one per CPod and process holding its connections."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sxwl.cloud.db.models import Base
from sxwl.cloud.db.types import UTCDateTime


class TunnelReplica(Base):
    __tablename__ = "tunnel_replicas"
    # A random name per process, and where other replicas reach it (SXWL_REPLICA_URL).
    replica: Mapped[str] = mapped_column(String(32), primary_key=True)
    url: Mapped[str] = mapped_column(String(500))
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime)


class TunnelHolder(Base):
    __tablename__ = "tunnel_holders"
    cpod_id: Mapped[str] = mapped_column(ForeignKey("cpods.id", ondelete="CASCADE"), primary_key=True)
    replica: Mapped[str] = mapped_column(
        ForeignKey("tunnel_replicas.replica", ondelete="CASCADE"), primary_key=True
    )
    connections: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index("ix_tunnel_holders_replica", "replica"),)
