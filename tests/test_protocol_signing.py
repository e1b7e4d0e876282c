"""Ed25519 signatures over the canonical rendering (wire-format.md section 4)."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives import serialization

from protocol import (
    build_request,
    build_response,
    canonical_bytes,
    generate_keypair,
    load_private_key,
    load_public_key,
    parse,
    public_key_id,
    render,
    render_body,
    sign,
    signature_problem,
    verify,
)


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return generate_keypair()


def _signed_text(private_pem: bytes) -> str:
    msg = build_request(
        sender="Lotbot",
        to="Mantis",
        task="line one\n  indented ``` fence\nline three",
        request_id="lotbot-1",
        trace_id="t-1",
        meta=[("X-Run", "7")],
    )
    return render(sign(msg, private_pem, key_id="lotbot-2026"))


def test_sign_sets_key_id_and_signature(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    msg = build_response(sender="a", to="b", request_id="r", status="done")
    signed = sign(msg, private_pem)
    assert signed.key_id == public_key_id(public_pem)
    assert signed.signature is not None and signed.signature.startswith("ed25519:")
    assert render_body(signed).splitlines()[-1].startswith("Signature: ed25519:")
    assert canonical_bytes(signed) == render_body(signed, signature=False).encode()
    assert verify(signed, public_pem)
    assert verify(parse(render(signed)).messages[0], public_pem)


def test_transit_changes_still_verify(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    text = _signed_text(private_pem)
    variants = [
        text.replace("\n", "\r\n"),
        text.replace("\n  ", "\n    "),
        "intro\n" + text.replace("```\n[", "```text\n[", 1) + "\noutro",
        text.replace("Task: line one", "task:    line one   "),
        text.replace("\n", "   \n"),
    ]
    assert verify(parse(text).messages[0], public_pem)
    results = [verify(parse(v).messages[0], public_pem) for v in variants]
    # Extra indentation changes the value (two spaces are removed, the rest is content);
    # trailing white space carries no meaning.
    assert results == [True, False, True, True, True]


def test_trailing_space_only_changes_in_values_break_nothing_outside(
    keys: tuple[bytes, bytes],
) -> None:
    private_pem, public_pem = keys
    text = _signed_text(private_pem).replace("Depth: 1/5", "Depth:   1/5   ")
    assert verify(parse(text).messages[0], public_pem)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("From: Lotbot", "From: Mallory"),
        ("Depth: 1/5", "Depth: 1/6"),
        ("line three", "line 3"),
        ("X-Run: 7", "X-Run: 8"),
        ("KeyId: lotbot-2026", "KeyId: other"),
        ("[REQUEST → @Mantis]", "[REQUEST → @Eve]"),
        ("Priority: normal", "Priority: high"),
    ],
)
def test_any_field_change_fails(keys: tuple[bytes, bytes], old: str, new: str) -> None:
    private_pem, public_pem = keys
    text = _signed_text(private_pem)
    assert old in text
    tampered = parse(text.replace(old, new)).messages[0]
    assert not verify(tampered, public_pem)


def test_wrong_key_and_garbage_fail(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    msg = parse(_signed_text(private_pem)).messages[0]
    _, other_public = generate_keypair()
    assert not verify(msg, other_public)
    for garbage in ("ed25519:!!!", "ed25519:", "rsa:abc", "ed25519:" + "A" * 86, "ed25519:AAAA"):
        assert not verify(msg.model_copy(update={"signature": garbage}), public_pem)
    assert not verify(msg.model_copy(update={"signature": None}), public_pem)
    assert not verify(msg, b"not a key")
    assert not verify(msg, "-----BEGIN PUBLIC KEY-----\nxx\n-----END PUBLIC KEY-----")


def test_raw_base64url_keys(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    private = load_private_key(private_pem)
    raw_private = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    raw_public = load_public_key(public_pem).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    b64_private = base64.urlsafe_b64encode(raw_private).rstrip(b"=").decode()
    b64_public = base64.urlsafe_b64encode(raw_public).rstrip(b"=")
    msg = build_response(sender="a", to="b", request_id="r", result="x")
    assert verify(sign(msg, b64_private), b64_public)
    assert verify(sign(msg, private), public_pem)
    with pytest.raises(ValueError, match="Ed25519"):
        load_private_key("abc")
    with pytest.raises(ValueError, match="Ed25519"):
        load_public_key(b"-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----")


def test_resigning_replaces_signature(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    other_private, other_public = generate_keypair()
    msg = build_response(sender="a", to="b", request_id="r", result="x")
    twice = sign(sign(msg, private_pem, key_id="k1"), other_private, key_id="k2")
    assert twice.key_id == "k2"
    assert verify(twice, other_public) and not verify(twice, public_pem)


def test_signature_problem_says_why(keys: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = keys
    msg = build_request(sender="Lotbot", to="Mantis", task="t", request_id="lotbot-1")
    signed = sign(msg, private_pem)  # default KeyId: this key's id
    own = public_key_id(public_pem)
    assert signature_problem(signed, public_pem) is None
    changed = signed.model_copy(update={"task": "u"})
    assert signature_problem(changed, public_pem) == (
        f"the text changed after it was signed (KeyId {own} is this key)")
    other_public = generate_keypair()[1]
    other = public_key_id(other_public)
    wrong = signature_problem(signed, other_public)
    assert wrong == f"wrong key: signed with key {own}, and this key is {other}"
    by_hand = sign(msg, private_pem, key_id="lot-1").model_copy(update={"task": "u"})
    assert "changed after it was signed, or another key" in str(
        signature_problem(by_hand, public_pem))
    assert signature_problem(msg, public_pem) == "not signed (no Signature field)"
    for bad, why in (("rsa:abc", "does not start with ed25519:"),
                     ("ed25519:" + base64.urlsafe_b64encode(b"x" * 10).decode(), "10 bytes"),
                     ("ed25519:é", "can not be read")):
        assert why in str(signature_problem(msg.model_copy(update={"signature": bad}),
                                            public_pem)), bad
    assert not verify(signed, other_public)
