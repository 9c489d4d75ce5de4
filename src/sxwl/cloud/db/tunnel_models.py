"""Which replica holds a CPod's tunnel connections (docs/tunnel.md): a request that reaches another
replica is relayed to one that holds them. A row per replica and CPod, renewed while held."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sxwl.cloud.db.models import Base
from sxwl.cloud.db.types import UTCDateTime


class TunnelHolder(Base):
    __tablename__ = "tunnel_holders"
    cpod_id: Mapped[str] = mapped_column(ForeignKey("cpods.id", ondelete="CASCADE"), primary_key=True)
    # A random name per process, and where other replicas reach it (SXWL_REPLICA_URL).
    replica: Mapped[str] = mapped_column(String(32), primary_key=True)
    replica_url: Mapped[str] = mapped_column(String(500))
    connections: Mapped[int] = mapped_column(Integer)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_tunnel_holders_replica", "replica"),)
