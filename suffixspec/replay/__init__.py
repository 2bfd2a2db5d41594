"""Replay recorded requests through a proposer and measure what it would save."""

from suffixspec.replay.harness import ReplayResult, replay
from suffixspec.replay.traces import Request, load_trace

__all__ = ["ReplayResult", "Request", "load_trace", "replay"]
