"""The principal of a caller, from its client certificate: which field names it (the subject,
its common name, a SAN URI such as a SPIFFE id, or a SAN DNS name), and Kafka-style mapping
rules (`ssl.principal.mapping.rules`) that turn that name into the principal's name. Pure: the
gRPC layer hands in what the TLS handshake verified."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from .acls import ANONYMOUS


class PrincipalSource(StrEnum):
    SUBJECT = "subject"  # "CN=worker-1,O=example"
    CN = "cn"
    SAN_URI = "san-uri"
    SAN_DNS = "san-dns"


@dataclass(frozen=True, slots=True)
class CertificateIdentity:
    """What the handshake verified of a client certificate."""

    subject: str = ""
    common_name: str = ""
    san_uris: tuple[str, ...] = ()
    san_dns: tuple[str, ...] = ()

    def name(self, source: PrincipalSource) -> str | None:
        if source is PrincipalSource.SUBJECT:
            return self.subject or None
        if source is PrincipalSource.CN:
            return self.common_name or None
        if source is PrincipalSource.SAN_URI:
            return self.san_uris[0] if self.san_uris else None
        return self.san_dns[0] if self.san_dns else None


@dataclass(frozen=True, slots=True)
class MappingRule:
    """`RULE:pattern/replacement/[L|U]` (the whole name must match), or DEFAULT (pattern
    None). The replacement is parsed when the rule is: literal text and group numbers
    (`$1`), so applying it never fails."""

    pattern: re.Pattern[str] | None
    template: tuple[str | int, ...] = ()
    case: str = ""

    def apply(self, name: str) -> str | None:
        if self.pattern is None:
            return name
        match = self.pattern.fullmatch(name)
        if match is None:
            return None
        out = "".join(
            part if isinstance(part, str) else (match.group(part) or "") for part in self.template
        )
        return out.lower() if self.case == "L" else out.upper() if self.case == "U" else out


def _template(replacement: str, groups: int) -> tuple[str | int, ...]:
    """Java's replacement syntax, as Kafka uses it: `$n` is group n, `\\$` and `\\\\` are
    literal; any other escape, or a group the pattern lacks, is an error."""
    parts: list[str | int] = []
    literal = ""
    i = 0
    while i < len(replacement):
        ch = replacement[i]
        if ch == "\\":
            if i + 1 >= len(replacement) or replacement[i + 1] not in "$\\":
                raise MappingRulesError(f"bad escape in replacement {replacement!r}")
            literal += replacement[i + 1]
            i += 2
        elif ch == "$":
            digits = re.match(r"\d+", replacement[i + 1 :])
            if digits is None:
                raise MappingRulesError(f"'$' without a group number in {replacement!r}")
            group = int(digits.group())
            if group > groups:
                raise MappingRulesError(
                    f"replacement {replacement!r} names group {group}; the pattern has {groups}"
                )
            if literal:
                parts.append(literal)
                literal = ""
            parts.append(group)
            i += 1 + len(digits.group())
        else:
            literal += ch
            i += 1
    if literal:
        parts.append(literal)
    return tuple(parts)


_RULE = re.compile(r"\s*(?:RULE:((?:\\/|[^/])*)/((?:\\/|[^/])*)/([LU]?)|(DEFAULT))\s*(?:,|$)")


class MappingRulesError(ValueError):
    pass


def parse_mapping_rules(text: str) -> tuple[MappingRule, ...]:
    """Kafka's syntax: comma-separated `RULE:pattern/replacement/[LU]` and `DEFAULT`; `$1` in a
    replacement is the first group. An empty text is DEFAULT alone."""
    if not text.strip():
        return (MappingRule(None),)
    rules: list[MappingRule] = []
    position = 0
    while position < len(text):
        match = _RULE.match(text, position)
        if match is None or match.end() == position:
            raise MappingRulesError(f"cannot read a mapping rule at {text[position:]!r}")
        if match.group(4):
            rules.append(MappingRule(None))
        else:
            pattern = match.group(1).replace("\\/", "/")
            try:
                compiled = re.compile(pattern)
            except re.error as error:
                raise MappingRulesError(f"bad pattern {pattern!r}: {error}") from error
            template = _template(match.group(2).replace("\\/", "/"), compiled.groups)
            rules.append(MappingRule(compiled, template, match.group(3)))
        position = match.end()
    return tuple(rules)


@dataclass(frozen=True, slots=True)
class PrincipalMapper:
    source: PrincipalSource = PrincipalSource.SUBJECT
    rules: Sequence[MappingRule] = (MappingRule(None),)

    def principal(self, identity: CertificateIdentity | None) -> str | None:
        """`User:<name>`; ANONYMOUS without a certificate; None when the certificate has no
        such field or no rule maps its name (the caller is then refused)."""
        if identity is None:
            return ANONYMOUS
        name = identity.name(self.source)
        if name is None:
            return None
        for rule in self.rules:
            mapped = rule.apply(name)
            if mapped is not None:
                return f"User:{mapped}" if mapped else None
        return None
