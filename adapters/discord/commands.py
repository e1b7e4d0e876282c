"""``/protocol`` as a native application command: one group, a subcommand per operator
command, typed options. Each subcommand hands ``(interaction, name, args)`` to one
callback, which runs it through the gateway and answers with an embed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import discord
from discord import app_commands

Run = Callable[[discord.Interaction, str, tuple[str, ...]], Awaitable[None]]

STATUSES = ("open", "clarifying", "handed_off", "done", "partial", "failed", "cancelled",
            "timeout")


def _args(*values: str | int | None) -> tuple[str, ...]:
    return tuple(str(v) for v in values if v is not None and v != "")


def protocol_group(name: str, run: Run) -> app_commands.Group:
    """The ``/<name>`` group whose subcommands call ``run``."""
    group = app_commands.Group(
        name=name, description="bot-protocol gateway: conversations, agents, operator actions"
    )

    @group.command(name="status", description="Counts, oldest open, per-agent load, health")
    @app_commands.describe(agent="Only this agent's load and open conversations")
    async def status(interaction: discord.Interaction, agent: str | None = None) -> None:
        await run(interaction, "status", _args(agent))

    @group.command(name="show", description="One conversation with its whole history")
    @app_commands.describe(request_id="The conversation's RequestId")
    async def show(interaction: discord.Interaction, request_id: str) -> None:
        await run(interaction, "show", _args(request_id))

    @group.command(name="list", description="Recent conversations, newest first")
    @app_commands.describe(status="Only conversations in this state", agent="Only this agent's")
    @app_commands.choices(status=[app_commands.Choice(name=s, value=s) for s in STATUSES])
    async def list_(
        interaction: discord.Interaction,
        status: app_commands.Choice[str] | None = None,
        agent: str | None = None,
    ) -> None:
        await run(interaction, "list", _args(status.value if status else None, agent))

    @group.command(name="agents", description="Declared and learned agents, a page at a time")
    @app_commands.describe(offset="Skip this many", limit="At most this many (1-100)")
    async def agents(
        interaction: discord.Interaction,
        offset: app_commands.Range[int, 0, 1_000_000] = 0,
        limit: app_commands.Range[int, 1, 100] = 25,
    ) -> None:
        await run(interaction, "agents", _args(offset, limit))

    @group.command(name="cancel", description="Cancel a conversation and tell both parties")
    @app_commands.describe(request_id="The conversation's RequestId", reason="Why (shown to both)")
    async def cancel(
        interaction: discord.Interaction, request_id: str, reason: str | None = None
    ) -> None:
        await run(interaction, "cancel", _args(request_id, reason))

    @group.command(name="key", description="Register (or remove) an agent's Ed25519 key")
    @app_commands.describe(agent="The agent", public_key="base64url public key, or 'remove'")
    async def key(interaction: discord.Interaction, agent: str, public_key: str) -> None:
        await run(interaction, "key", _args(agent, public_key))

    @group.command(name="help", description="What each /protocol command does")
    async def help_(interaction: discord.Interaction) -> None:
        await run(interaction, "help", ())

    return group
