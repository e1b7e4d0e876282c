"""Ed25519 signatures over the canonical rendering (wire-format.md section 4).

The signed bytes are the UTF-8 of `render_body` without fences and without the Signature
line (KeyId is signed). Verification re-renders the parsed message, so white space or
escaping changed in transit does not matter, and any change to a field does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from protocol.models import Message, MessageBase, check_token
from protocol.render import render_body

SIGNATURE_PREFIX = "ed25519:"
# What `public_key_id` makes: 16 lower-case hex digits.
_DEFAULT_KEY_ID = re.compile(r"[0-9a-f]{16}")
PrivateKeyLike = Ed25519PrivateKey | bytes | str
PublicKeyLike = Ed25519PublicKey | bytes | str
_K = TypeVar("_K", Ed25519PrivateKey, Ed25519PublicKey)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def canonical_bytes(msg: Message | MessageBase) -> bytes:
    """The bytes a signature covers: the rendering without fences and Signature line."""
    return render_body(msg, signature=False).encode("utf-8", "surrogatepass")


def generate_keypair() -> tuple[bytes, bytes]:
    """A new key pair as (private PEM in PKCS#8, public PEM in SubjectPublicKeyInfo)."""
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def _load_key(
    data: bytes | str,
    kind: str,
    from_pem: Callable[[bytes], object],
    from_raw: Callable[[bytes], _K],
    key_type: type[_K],
) -> _K:
    raw = (data.encode("utf-8") if isinstance(data, str) else data).strip()
    if raw.startswith(b"-----BEGIN"):
        try:
            key = from_pem(raw)
        except ValueError as exc:
            raise ValueError(f"not an Ed25519 {kind} key in PEM: {exc}") from None
        if not isinstance(key, key_type):
            raise ValueError(f"the PEM data holds a {kind} key that is not Ed25519")
        return key
    try:
        return from_raw(_unb64url(raw.decode("ascii")))
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"not an Ed25519 {kind} key (PEM or base64url 32 bytes): {exc}") from None


def load_private_key(data: PrivateKeyLike) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM (PKCS#8) or a raw 32-byte key in base64url."""
    if isinstance(data, Ed25519PrivateKey):
        return data
    return _load_key(
        data,
        "private",
        lambda pem: serialization.load_pem_private_key(pem, password=None),
        Ed25519PrivateKey.from_private_bytes,
        Ed25519PrivateKey,  # type: ignore[type-abstract]
    )


def load_public_key(data: PublicKeyLike) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (SubjectPublicKeyInfo) or raw 32 bytes in base64url."""
    if isinstance(data, Ed25519PublicKey):
        return data
    return _load_key(
        data,
        "public",
        serialization.load_pem_public_key,
        Ed25519PublicKey.from_public_bytes,
        Ed25519PublicKey,  # type: ignore[type-abstract]
    )


def public_key_id(public_key: PublicKeyLike) -> str:
    """The default KeyId of a key: the first 16 hex digits of SHA-256 of its raw bytes."""
    raw = load_public_key(public_key).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(
    msg: Message | MessageBase, private_key: PrivateKeyLike, key_id: str | None = None
) -> Message:
    """A copy of ``msg`` with KeyId and ``Signature: ed25519:<base64url>``.

    ``key_id`` defaults to the message's KeyId, else to `public_key_id` of the key.
    """
    key = load_private_key(private_key)
    kid = check_token(key_id or msg.key_id or public_key_id(key.public_key()), "a KeyId")
    unsigned = msg.model_copy(update={"key_id": kid, "signature": None})
    signature = SIGNATURE_PREFIX + _b64url(key.sign(canonical_bytes(unsigned)))
    return unsigned.model_copy(update={"signature": signature})  # type: ignore[return-value]


def verify(msg: Message | MessageBase, public_key: PublicKeyLike) -> bool:
    """True when ``msg`` carries a valid Ed25519 signature by ``public_key``; never raises."""
    return signature_problem(msg, public_key) is None


def signature_problem(msg: Message | MessageBase, public_key: PublicKeyLike) -> str | None:
    """Why ``msg`` does not verify with ``public_key``, in a short phrase; None when it does.

    An Ed25519 signature does not say which key made it, so "the text changed" and
    "another key signed it" are told apart by the KeyId: when the message names this
    key's default KeyId (`public_key_id`) the key is right and the text changed; when it
    names another default KeyId, another key signed it. A KeyId chosen by hand can't
    tell, and the answer says both.
    """
    signature = msg.signature
    if not signature:
        return "not signed (no Signature field)"
    if not signature.startswith(SIGNATURE_PREFIX):
        return f"the Signature does not start with {SIGNATURE_PREFIX}"
    try:
        key = load_public_key(public_key)
        raw = _unb64url(signature[len(SIGNATURE_PREFIX) :])
    except (ValueError, TypeError, binascii.Error, UnicodeError) as exc:
        return f"the Signature or key can not be read: {exc}"
    if len(raw) != 64:
        return f"the Signature holds {len(raw)} bytes, not the 64 of an Ed25519 signature"
    try:
        key.verify(raw, canonical_bytes(msg))
    except InvalidSignature:
        pass
    except (ValueError, TypeError, UnicodeError) as exc:
        return f"the message can not be checked: {exc}"
    else:
        return None
    own_id = public_key_id(key)
    if msg.key_id == own_id:
        return f"the text changed after it was signed (KeyId {own_id} is this key)"
    if msg.key_id and _DEFAULT_KEY_ID.fullmatch(msg.key_id):
        return f"wrong key: signed with key {msg.key_id}, and this key is {own_id}"
    return (f"the text changed after it was signed, or another key signed it "
            f"(KeyId {msg.key_id or '-'}; this key's default KeyId is {own_id})")
