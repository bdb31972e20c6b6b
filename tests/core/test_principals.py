"""Principals from client certificates (`core/principals.py`): which field of the certificate
names the caller (`PrincipalSource`), and Kafka's `ssl.principal.mapping.rules`, parsed and
applied. The examples are Kafka's own (its documentation and `SslPrincipalMapperTest`): the
same rules text must give the same names here as in a Kafka broker."""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coordinator_svc.core.acls import ANONYMOUS
from coordinator_svc.core.principals import (
    CertificateIdentity,
    MappingRule,
    MappingRulesError,
    PrincipalMapper,
    PrincipalSource,
    parse_mapping_rules,
)


def mapped(rules: str, name: str) -> str | None:
    """What the rules make of `name` (None: no rule maps it), as the subject of a cert."""
    mapper = PrincipalMapper(PrincipalSource.SUBJECT, parse_mapping_rules(rules))
    principal = mapper.principal(CertificateIdentity(subject=name))
    if principal is None:
        return None
    assert principal.startswith("User:"), principal
    return principal[len("User:") :]


# --- parsing ------------------------------------------------------------------------------------


def test_default_and_an_empty_text_are_the_identity() -> None:
    for text in ("DEFAULT", "", "   ", " DEFAULT "):
        rules = parse_mapping_rules(text)
        assert rules == (MappingRule(None),), text
        assert mapped(text, "CN=worker-1,O=example") == "CN=worker-1,O=example"


#: Kafka's SslPrincipalMapperTest.testValidRules, with the number of rules each holds.
KAFKA_VALID_RULES = [
    ("DEFAULT", 1),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/", 1),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT", 2),
    ("RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/", 1),
    ("RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L", 1),
    ("RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U", 1),
    ("RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/", 1),
    ("RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/", 1),
    # From testRulesSplitting: whitespace around rules and inside them.
    ("RULE://,DEFAULT", 2),
    ("  RULE:// ,  DEFAULT  ", 2),
    ("  RULE:   /     / , DEFAULT  ", 2),
    ("  RULE:  /     /U   ,DEFAULT  ", 2),
    ("  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ", 3),
    ("RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/", 2),
]


@pytest.mark.parametrize(("text", "count"), KAFKA_VALID_RULES)
def test_kafkas_valid_rules_parse(text: str, count: int) -> None:
    assert len(parse_mapping_rules(text)) == count


#: Kafka's SslPrincipalMapperTest.testInvalidRules, and more of the same kind.
KAFKA_INVALID_RULES = [
    "default",
    "DEFAUL",
    "DEFAULT/L",
    "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
    "RULE:^CN=(.*?)$/$1/X",
    "DEFAULT DEFAULT",
    "RULE:^CN=(.*?$/$1/",  # an unbalanced parenthesis: not a regular expression
    "RULE:[/$1/",
]


@pytest.mark.parametrize("text", KAFKA_INVALID_RULES)
def test_bad_syntax_is_a_mapping_rules_error(text: str) -> None:
    with pytest.raises(MappingRulesError):
        parse_mapping_rules(text)


@pytest.mark.parametrize(
    "text",
    [
        "RULE:^CN=([^,]+),.*$/$2/",  # the pattern has one group
        "RULE:^CN=([^,]+),.*$/$1\\q/",  # not an escape in a replacement
    ],
)
def test_a_replacement_that_cannot_be_applied_is_refused_when_parsed(text: str) -> None:
    """`serve` checks the rules at start (exit 2) so that a typo is not found at every
    handshake: a rule whose replacement names a group its pattern lacks, or holds a bad escape,
    must be refused then, not raise when a certificate matches it."""
    with pytest.raises(MappingRulesError):
        parse_mapping_rules(text)


# --- applying -----------------------------------------------------------------------------------

#: Kafka's SslPrincipalMapperTest.testSslPrincipalMapper.
KAFKA_MAPPER_RULES = (
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, "
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L, "
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U, "
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U, "
    "DEFAULT"
)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
        ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
        ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
        ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
        ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
    ],
)
def test_kafkas_mapper_examples(name: str, expected: str) -> None:
    assert mapped(KAFKA_MAPPER_RULES, name) == expected


def test_kafkas_documentation_example_with_rules_on_lines_of_their_own() -> None:
    rules = (
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,\n"
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,\n"
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,\n"
        "DEFAULT"
    )
    assert len(parse_mapping_rules(rules)) == 4
    name = "CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown"
    assert mapped(rules, name) == "serviceuser"
    name = "CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown"
    assert mapped(rules, name) == "adminuser@admin"


def test_kafkas_comma_with_whitespace_example() -> None:
    rules = "RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT"
    assert mapped(rules, "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


def test_the_readme_example_and_lower_and_upper_case() -> None:
    rules = "RULE:^CN=([^,]+),.*$/$1/L,DEFAULT"
    assert mapped(rules, "CN=Worker-1,O=Example") == "worker-1"
    assert mapped("RULE:^CN=([^,]+),.*$/$1/U", "CN=Worker-1,O=Example") == "WORKER-1"
    assert mapped("RULE:^CN=([^,]+),.*$/$1/", "CN=Worker-1,O=Example") == "Worker-1"


def test_a_rule_matches_the_whole_name_only() -> None:
    assert mapped("RULE:CN=a/x/", "CN=a,O=b") is None
    assert mapped("RULE:CN=a/x/", "xCN=a") is None
    assert mapped("RULE:CN=a/x/", "CN=a") == "x"
    assert mapped("RULE:CN=a.*/x/", "CN=a,O=b") == "x"


def test_the_first_matching_rule_wins_and_no_match_is_none() -> None:
    rules = "RULE:^CN=(.*),O=a$/first-$1/,RULE:^CN=(.*),O=.*$/second-$1/,DEFAULT"
    assert mapped(rules, "CN=w,O=a") == "first-w"
    assert mapped(rules, "CN=w,O=b") == "second-w"
    assert mapped(rules, "OU=x") == "OU=x"
    without_default = "RULE:^CN=(.*),O=a$/first-$1/,RULE:^CN=(.*),O=b$/second-$1/"
    assert mapped(without_default, "CN=w,O=c") is None
    assert mapped(without_default, "OU=x") is None


def test_a_rule_that_maps_to_nothing_names_no_principal() -> None:
    assert mapped("RULE:^CN=([^,]*),.*$/$1/,DEFAULT", "CN=,O=x") is None


def test_an_escaped_slash_in_a_pattern_and_a_spiffe_id() -> None:
    rules = "RULE:^spiffe:\\/\\/example\\.org\\/ns\\/([^\\/]+)\\/sa\\/(.*)$/$2@$1/"
    mapper = PrincipalMapper(PrincipalSource.SAN_URI, parse_mapping_rules(rules))
    identity = CertificateIdentity(san_uris=("spiffe://example.org/ns/prod/sa/connect-worker",))
    assert mapper.principal(identity) == "User:connect-worker@prod"
    assert (
        mapper.principal(CertificateIdentity(san_uris=("spiffe://other.org/ns/prod/sa/w",))) is None
    )


# --- properties ---------------------------------------------------------------------------------

NAMES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp")),
    min_size=1,
    max_size=40,
)
#: Names of the kinds certificates carry, with the characters that need escaping in rules.
DN_NAMES = st.text(alphabet="abcXYZ019=,.-_ +*?()[]{}^$|\\/@:", min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(NAMES)
def test_default_maps_every_name_to_itself(name: str) -> None:
    assert mapped("DEFAULT", name) == name
    assert mapped("RULE:(.*)/$1/", name) == name


@settings(max_examples=300, deadline=None)
@given(NAMES)
def test_l_and_u_are_the_lower_and_upper_case_of_the_plain_rule(name: str) -> None:
    plain = mapped("RULE:(.*)/$1/", name)
    assert plain is not None
    assert mapped("RULE:(.*)/$1/L", name) == plain.lower()
    assert mapped("RULE:(.*)/$1/U", name) == plain.upper()


def kafka_rule_for(literal: str, replacement: str) -> str:
    """A rule matching exactly `literal`, escaped as a Kafka user would: a regular expression
    for it, with `/` written `\\/` so that it does not end the pattern."""
    pattern = re.escape(literal).replace("/", "\\/")
    return f"RULE:{pattern}/{replacement}/"


@settings(max_examples=400, deadline=None)
@given(DN_NAMES, DN_NAMES)
def test_a_rule_for_one_escaped_name_maps_it_and_nothing_else(name: str, other: str) -> None:
    rules = kafka_rule_for(name, "matched") + ",DEFAULT"
    assert mapped(rules, name) == "matched", rules
    assume(other != name)
    assert mapped(rules, other) == other, rules


RULE_TEXTS = st.lists(
    st.one_of(
        st.just("DEFAULT"),
        st.builds(
            lambda p, r, c: f"RULE:{p}/{r}/{c}",
            st.sampled_from(["(.*)", "^CN=([^,]*),(.*)$", "(a)(b)?.*", "x", ".*", "(.)"]),
            st.text(alphabet="ab$12\\@-", max_size=6),
            st.sampled_from(["", "L", "U"]),
        ),
    ),
    min_size=1,
    max_size=3,
).map(",".join)


@settings(max_examples=400, deadline=None)
@given(RULE_TEXTS, DN_NAMES)
def test_rules_that_parse_name_or_refuse_every_certificate_without_raising(
    text: str, name: str
) -> None:
    """A rules text either fails to parse (the server refuses to start) or maps every name to
    a principal or to None; applying it never raises (that would fail the call instead of
    refusing it)."""
    try:
        rules = parse_mapping_rules(text)
    except MappingRulesError:
        return
    mapper = PrincipalMapper(PrincipalSource.SUBJECT, rules)
    principal = mapper.principal(CertificateIdentity(subject=name))
    assert principal is None or principal.startswith("User:")


# --- where the name comes from ------------------------------------------------------------------


def test_the_principal_sources_are_the_cli_choices() -> None:
    assert sorted(s.value for s in PrincipalSource) == ["cn", "san-dns", "san-uri", "subject"]


IDENTITY = CertificateIdentity(
    subject="CN=worker-1,O=example",
    common_name="worker-1",
    san_uris=("spiffe://example.org/w1", "https://example.org/w1"),
    san_dns=("w1.example.org", "w1.other.org"),
)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (PrincipalSource.SUBJECT, "User:CN=worker-1,O=example"),
        (PrincipalSource.CN, "User:worker-1"),
        (PrincipalSource.SAN_URI, "User:spiffe://example.org/w1"),
        (PrincipalSource.SAN_DNS, "User:w1.example.org"),
    ],
)
def test_each_source_names_the_principal_by_its_field(
    source: PrincipalSource, expected: str
) -> None:
    assert PrincipalMapper(source).principal(IDENTITY) == expected


@pytest.mark.parametrize("source", list(PrincipalSource))
def test_a_certificate_without_the_field_names_no_principal(source: PrincipalSource) -> None:
    empty = CertificateIdentity()
    assert PrincipalMapper(source).principal(empty) is None


@pytest.mark.parametrize("source", list(PrincipalSource))
def test_no_certificate_is_anonymous(source: PrincipalSource) -> None:
    assert PrincipalMapper(source).principal(None) == ANONYMOUS


def test_rules_apply_to_the_chosen_field() -> None:
    rules = parse_mapping_rules("RULE:^(.*)\\.example\\.org$/$1/,RULE:^CN=(.*),O=.*$/cn-$1/")
    assert PrincipalMapper(PrincipalSource.SAN_DNS, rules).principal(IDENTITY) == "User:w1"
    assert PrincipalMapper(PrincipalSource.SUBJECT, rules).principal(IDENTITY) == "User:cn-worker-1"
    assert PrincipalMapper(PrincipalSource.CN, rules).principal(IDENTITY) is None
