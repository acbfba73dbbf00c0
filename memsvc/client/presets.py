"""Deadline presets: how long a gateway can afford to wait for memory in one kind of turn."""

from __future__ import annotations

from typing import Literal

Preset = Literal["voice", "chat"]

#: Whole-call deadline in milliseconds, retries included. A voice turn has about 200 ms of
#: silence to spare before the caller notices; a chat turn can wait for a typing indicator.
PRESETS: dict[Preset, int] = {"voice": 200, "chat": 800}


def timeout_s(preset: Preset, timeout: float | None) -> float:
    """The call's budget in seconds: an explicit ``timeout`` wins over the preset."""
    if timeout is not None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        return timeout
    try:
        return PRESETS[preset] / 1000
    except KeyError:
        raise ValueError(f"unknown deadline preset {preset!r} (one of {sorted(PRESETS)})") from None
