"""Names and subjects of the mq9 service: address rules, storage names, subject parsing.

Every name an agent sends is hostile: addresses are checked against the broker's rules,
and keys, group names and agent names are hex-encoded before they become part of a NATS
subject, stream or KV key, so no input can reach another mailbox's storage.
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass
from enum import StrEnum

API_PREFIX = "$mq9.AI."
MAX_ADDRESS_LENGTH = 128
GENERATED_ADDRESS_LENGTH = 20
_ADDRESS = re.compile(r"[a-z0-9.]+")
_ALPHABET = string.ascii_lowercase + string.digits
_NAMESPACE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


class Lane(StrEnum):
    """A priority lane; FETCH serves lanes in the order of ``LANES``."""

    CRITICAL = "critical"
    URGENT = "urgent"
    NORMAL = "normal"

    @classmethod
    def parse(cls, value: str | None) -> Lane:
        """The lane an ``mq9-priority`` header names; unknown or absent is normal (broker)."""
        try:
            return cls(value) if value is not None else cls.NORMAL
        except ValueError:
            return cls.NORMAL

    @property
    def token(self) -> str:
        """One-letter subject token of the lane."""
        return self.value[0]


LANES: tuple[Lane, ...] = (Lane.CRITICAL, Lane.URGENT, Lane.NORMAL)
LANE_BY_TOKEN = {lane.token: lane for lane in LANES}


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a valid mail_address, or None when it is."""
    if not address:
        return "must not be empty"
    if len(address) > MAX_ADDRESS_LENGTH:
        return f"longer than {MAX_ADDRESS_LENGTH} characters"
    if not _ADDRESS.fullmatch(address):
        return "only lowercase letters, digits and '.' are allowed"
    if address.startswith(".") or address.endswith("."):
        return "must not start or end with '.'"
    if ".." in address:
        return "must not contain '..'"
    return None


def generate_address() -> str:
    """A fresh unguessable 20-character address (as the broker makes for a nameless CREATE)."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(GENERATED_ADDRESS_LENGTH))


def check_namespace(namespace: str) -> str:
    """``namespace`` when usable in stream, bucket and subject names; ValueError otherwise."""
    if not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            "namespace must be 1-32 characters of lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return namespace


def hex_token(text: str) -> str:
    """``text`` as one subject/KV-key token (``x`` + hex of its UTF-8), empty text included."""
    return "x" + text.encode().hex()


@dataclass(frozen=True)
class Names:
    """Stream, bucket and subject names of one service namespace."""

    namespace: str

    def box_token(self, address: str) -> str:
        """A valid address as a single subject/stream-name token ('.' -> '_' is one-to-one,
        since addresses never contain '_')."""
        return address.replace(".", "_")

    def box_stream(self, address: str) -> str:
        """The stream holding one mailbox's messages (msg_id = stream sequence - 1)."""
        return f"{self.namespace}_box_{self.box_token(address)}"

    @property
    def box_filter(self) -> str:
        """Subjects of every mailbox stream (used to list and count mailboxes)."""
        return f"{self.namespace}.box.>"

    def box_subjects(self, address: str) -> str:
        """All subjects of one mailbox."""
        return f"{self.namespace}.box.{self.box_token(address)}.>"

    def message_subject(self, address: str, lane: Lane, key: str | None) -> str:
        """Where a message is stored: mailbox, lane, then its key (``_`` when it has none)."""
        key_token = "_" if key is None else hex_token(key)
        return f"{self.namespace}.box.{self.box_token(address)}.{lane.token}.{key_token}"

    def lane_filter(self, address: str, lane: Lane) -> str:
        """Subjects of one lane of one mailbox."""
        return f"{self.namespace}.box.{self.box_token(address)}.{lane.token}.*"

    def key_filter(self, address: str, key: str) -> str:
        """Subjects of one key in every lane of a mailbox (for key compaction)."""
        return f"{self.namespace}.box.{self.box_token(address)}.*.{hex_token(key)}"

    @property
    def delayed_stream(self) -> str:
        """The stream of delayed messages waiting to become visible."""
        return f"{self.namespace}_delayed"

    def delayed_subject(self, address: str) -> str:
        """Where a delayed message for ``address`` waits."""
        return f"{self.namespace}.delayed.{self.box_token(address)}"

    @property
    def delayer_consumer(self) -> str:
        """The durable consumer every service instance shares to move due messages."""
        return f"{self.namespace}_delayer"

    @property
    def groups_bucket(self) -> str:
        """KV bucket of consumer-group offsets."""
        return f"{self.namespace}_groups"

    def group_key(self, address: str, group: str) -> str:
        """KV key of one group's offsets in one mailbox."""
        return f"{self.box_token(address)}.{hex_token(group)}"

    def group_prefix_subject(self, address: str) -> str:
        """KV stream subjects of every group of one mailbox (purged with the mailbox)."""
        return f"$KV.{self.groups_bucket}.{self.box_token(address)}.>"

    @property
    def agents_stream(self) -> str:
        """The stream of agent registrations (one message per agent name)."""
        return f"{self.namespace}_agents"

    def agent_subject(self, name: str) -> str:
        """Where one agent's registration is kept."""
        return f"{self.namespace}.agent.{hex_token(name)}"

    @property
    def agents_filter(self) -> str:
        """Subjects of every agent registration."""
        return f"{self.namespace}.agent.*"


def split_address_and_id(rest: str) -> tuple[str, str]:
    """``addr.parts.ID`` of a DELETE subject as (address, id text)."""
    address, _, msg_id = rest.rpartition(".")
    return address, msg_id
