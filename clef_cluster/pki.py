"""The cluster's keys and certificates: one CA, serving certificates, client certificates, the service-account key.

Made fresh by every ``up`` (nothing is reused between clusters); EC P-256 keys, valid for 30 days.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)
LOOPBACK_NAMES = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


class Authority:
    """A CA that signs the cluster's serving and client certificates, kept as PEM files in ``folder``."""

    def __init__(self, folder: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
        self.folder = folder
        self.cert = folder / "ca.crt"
        self._key = key
        self._name = cert.subject

    @classmethod
    def create(cls, folder: Path) -> Authority:
        """A new CA whose certificate and key are written to ``folder`` (ca.crt, ca.key)."""
        folder.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "clef-cluster-ca")])
        cert = (
            _builder(name, name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        (folder / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_key(folder / "ca.key", key)
        return cls(folder, key, cert)

    @classmethod
    def load(cls, folder: Path) -> Authority:
        """The CA that :meth:`create` wrote to ``folder``."""
        key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cls(folder, key, x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes()))

    def serving(self, name: str, hosts: tuple[str, ...] = LOOPBACK_NAMES) -> Pair:
        """A server certificate for ``hosts`` (IP addresses or DNS names)."""
        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        return self._issue(name, name, ExtendedKeyUsageOID.SERVER_AUTH, sans)

    def client(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Pair:
        """A client certificate: the API server reads the user from CN and the groups from O."""
        return self._issue(name, user, ExtendedKeyUsageOID.CLIENT_AUTH, [], groups)

    def _issue(
        self,
        name: str,
        common_name: str,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
        groups: tuple[str, ...] = (),
    ) -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]
        )
        builder = _builder(subject, self._name, key.public_key()).add_extension(
            x509.ExtendedKeyUsage([usage]), critical=False
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        pair = Pair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        pair.cert.write_bytes(builder.sign(self._key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        write_key(pair.key, key)
        return pair


def signing_key(folder: Path) -> Pair:
    """The service-account token signing key: ``cert`` holds the public key, ``key`` the private one."""
    key = ec.generate_private_key(ec.SECP256R1())
    pair = Pair(folder / "sa.pub", folder / "sa.key")
    pair.cert.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    write_key(pair.key, key)
    return pair


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write a private key readable by its owner only."""
    path.touch(mode=0o600)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )
