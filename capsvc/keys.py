"""Vat keys: private keys on disk, their fingerprints, and certificates made from them.

Theory of operation
-------------------
A capsvc server that speaks TLS is known by its key, not by a CA (the ``capnp://`` address
form of OCaml capnp-rpc, capsvc.transport.address): clients pin the key's *fingerprint*,
``sha-256:`` + the base64url (RFC 4648 §5, without padding) of the SHA-256 of the DER
SubjectPublicKeyInfo of the public key. That is capnp-rpc's ``Auth.Digest`` (capnp-rpc-net
auth.ml: X509's ``Public_key.fingerprint`` hashes the DER public key, and the URI carries
it unpadded in the uri-safe alphabet), so a fingerprint printed by either side pins the
same key on the other. Hashing the key rather than the certificate means a server may
renew or re-sign its certificate without its clients noticing.

- :func:`generate_key` writes a new ECDSA P-256 key (serving-notes §4 F4: P-256 by default,
  a signature costs ~1/30 of an RSA-2048 one) as unencrypted PKCS#8 PEM, readable by its
  owner only, and never over an existing file (a key is an identity: overwriting one
  silently would orphan every address that pins it).
- :func:`load_private_key` reads PEM keys: EC, RSA (capnp-rpc's default, RSA-2048) and
  Ed25519.
- :func:`self_signed_certificate` wraps a key in the certificate TLS needs to present it.
  Clients that pin never look at anything but its key; for those that check it against
  a CA file (``tls:`` addresses), it is its own CA and names the loopback host (SANs
  ``localhost``, ``127.0.0.1``, ``::1``) and ``capnp`` (capnp-rpc's client checks that
  name, auth.ml ``authenticator``).

This module needs the ``cryptography`` package (``capsvc[tls]``); it is imported only when
TLS is used, so plain TCP users never need it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
from typing import TypeAlias

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("TLS needs the cryptography package: pip install 'capsvc[tls]'") from error

from capsvc.transport.address import FINGERPRINT_PREFIX

__all__ = [
    "PrivateKey",
    "PublicKey",
    "fingerprint_of_certificate",
    "fingerprint_of_certificate_file",
    "fingerprint_of_key",
    "fingerprint_of_key_file",
    "fingerprint_of_public_key",
    "generate_key",
    "load_private_key",
    "private_key_pem",
    "self_signed_certificate",
]

#: The private keys capsvc serves with.
PrivateKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
#: Their public halves (what a fingerprint is taken of).
PublicKey: TypeAlias = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey

_KEY_MODE = 0o600  # owner read/write only: a key file is a secret
#: RFC 5280 §4.1.2.5: 99991231235959Z means "no well-defined expiration date".
_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
_NOT_BEFORE = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_COMMON_NAME = "capsvc"
#: Names the self-signed certificate is valid for (module docstring).
_DNS_NAMES = ("localhost", "capnp")
_IP_ADDRESSES = ("127.0.0.1", "::1")

StrPath: TypeAlias = str | os.PathLike[str]


def generate_key(path: StrPath, *, rsa_bits: int | None = None) -> str:
    """Write a new private key to ``path`` (mode 0600) and return its fingerprint.

    ECDSA P-256 by default; ``rsa_bits`` makes an RSA key of that size instead (capnp-rpc
    makes RSA-2048 keys; some older TLS stacks sign with nothing else). Refuses to replace
    an existing file (``FileExistsError``): the file is created with ``O_EXCL``, so not
    even a race with another process can overwrite a key.
    """
    key: PrivateKey
    if rsa_bits is None:
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        if rsa_bits < 2048:
            # OpenSSL's default security level refuses smaller RSA keys in TLS anyway.
            raise ValueError(f"RSA keys must have at least 2048 bits, not {rsa_bits}")
        key = rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    pem = private_key_pem(key)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _KEY_MODE)
    except FileExistsError:
        raise FileExistsError(
            f"{os.fspath(path)} already exists: refusing to overwrite a key (an address "
            "may pin it); remove it first or choose another path"
        ) from None
    try:
        os.fchmod(fd, _KEY_MODE)  # O_CREAT's mode is masked by the umask; this is not
        with os.fdopen(fd, "wb") as sink:
            fd = -1
            sink.write(pem)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        os.unlink(path)
        raise
    return fingerprint_of_key(key)


def load_private_key(path: StrPath) -> PrivateKey:
    """Read a PEM private key (EC, RSA or Ed25519, unencrypted) from ``path``."""
    with open(path, "rb") as source:
        data = source.read()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ValueError(
            f"{os.fspath(path)}: the private key is encrypted; capsvc reads unencrypted "
            "keys only (keep the file mode 0600 instead)"
        ) from None
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)}: not a PEM private key ({error})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
                      | ed25519.Ed25519PrivateKey):  # fmt: skip
        raise ValueError(
            f"{os.fspath(path)}: a {type(key).__name__} cannot serve TLS here; "
            "use an ECDSA, RSA or Ed25519 key"
        )
    return key


def private_key_pem(key: PrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM (``BEGIN PRIVATE KEY``)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def fingerprint_of_public_key(key: PublicKey | CertificatePublicKeyTypes) -> str:
    """``sha-256:`` + unpadded base64url of SHA-256(DER SubjectPublicKeyInfo)."""
    spki = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    digest = hashlib.sha256(spki).digest()
    return FINGERPRINT_PREFIX + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def fingerprint_of_key(key: PrivateKey) -> str:
    """The fingerprint of a private key's public half."""
    return fingerprint_of_public_key(key.public_key())


def fingerprint_of_key_file(path: StrPath) -> str:
    """The fingerprint of the key in a PEM private key file."""
    return fingerprint_of_key(load_private_key(path))


def fingerprint_of_certificate(der: bytes) -> str:
    """The fingerprint of the key a DER certificate carries (what a TLS peer presented)."""
    return _spki_fingerprint(x509.load_der_x509_certificate(der))


def fingerprint_of_certificate_file(path: StrPath) -> str:
    """The fingerprint of the first certificate's key in a PEM file (a chain's leaf)."""
    with open(path, "rb") as source:
        data = source.read()
    try:
        certificate = x509.load_pem_x509_certificate(data)
    except ValueError as error:
        raise ValueError(f"{os.fspath(path)}: not a PEM certificate ({error})") from None
    return _spki_fingerprint(certificate)


def _spki_fingerprint(certificate: x509.Certificate) -> str:
    # public_key() takes every key type a certificate can carry; re-encoded as DER
    # SubjectPublicKeyInfo it is what capnp-rpc hashes too (X509.Public_key.encode_der).
    return fingerprint_of_public_key(certificate.public_key())


def self_signed_certificate(key: PrivateKey) -> bytes:
    """A PEM certificate for ``key``, signed by itself (module docstring).

    Subject and issuer CN=capsvc; valid from 2000 until 9999-12-31 (RFC 5280's "no
    expiry"): the key is the identity, so the certificate has nothing to expire for; SANs
    localhost, capnp, 127.0.0.1 and ::1; an end-entity for both TLS server and client
    authentication (a client vat presents one too).
    """
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, _COMMON_NAME)])
    public = key.public_key()
    identifier = x509.SubjectKeyIdentifier.from_public_key(public)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in _DNS_NAMES]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in _IP_ADDRESSES]
    usage = x509.KeyUsage(
        digital_signature=True,
        # RSA key exchange (TLS 1.2 without (EC)DHE) encrypts to the key itself.
        key_encipherment=isinstance(key, rsa.RSAPrivateKey),
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(_NOT_BEFORE)
        .not_valid_after(_NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(identifier, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(identifier),
            critical=False,
        )
    )
    # Ed25519 signs the message itself (no separate hash, RFC 8410 §6).
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM)
