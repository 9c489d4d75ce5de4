"""Wire models shared by the cloud and the agent."""

from sxwl.protocol.models import (
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    GpuDevice,
    GpuInfo,
    Heartbeat,
    HeartbeatReply,
    JobReport,
    Node,
    RegisterReply,
    RegisterRequest,
)

__all__ = [
    "PROTOCOL_HEADER",
    "PROTOCOL_VERSION",
    "GpuDevice",
    "GpuInfo",
    "Heartbeat",
    "HeartbeatReply",
    "JobReport",
    "Node",
    "RegisterReply",
    "RegisterRequest",
]
