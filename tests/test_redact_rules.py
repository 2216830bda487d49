"""Each redaction rule (``corral_systemd/common/redact.py``) has an input that only it catches.

Issue 15, "Test strength": the bearer rule's only test input was an
``Authorization: Bearer`` header, which the header rule catches first, so
the bearer rule could be removed with every test still passing. Each case
below is redacted by exactly one rule: remove that rule and its case goes red.
"""

import pytest

from corral_systemd.common.redact import REDACTED, redact_argv

R = REDACTED

CASES = {
    # rule: header names (Authorization:, Cookie:, X-Api-Key: ...), whatever the value
    "header": [
        (["curl", "-H", "Authorization: Basic dXNlcjpwYXNz"], ["curl", "-H", f"Authorization: {R}"]),
        (["curl", "-H", "Cookie: session=abc"], ["curl", "-H", f"Cookie: {R}"]),
        (["curl", "-H", "x-api-key: abc"], ["curl", "-H", f"x-api-key: {R}"]),
    ],
    # rule: "Bearer <token>" anywhere in an argument that is not one of the headers above
    "bearer": [
        (["curl", "--oauth2-bearer-header", "Bearer abc.def"], ["curl", "--oauth2-bearer-header", f"Bearer {R}"]),
        (["curl", "-H", "X-Upstream-Auth: Bearer abc.def"], ["curl", "-H", f"X-Upstream-Auth: Bearer {R}"]),
        (
            ["curl", "--header=X-Forwarded-Authorization: bearer abc"],
            ["curl", f"--header=X-Forwarded-Authorization: bearer {R}"],
        ),
    ],
    # rule: NAME=VALUE with a secret-looking NAME
    "name_value": [
        (["env", "API_TOKEN=abc", "PATH=/bin"], ["env", f"API_TOKEN={R}", "PATH=/bin"]),
        (["tool", "--db-password=abc"], ["tool", f"--db-password={R}"]),
    ],
    # rule: the password of a URL (a user without one is left alone)
    "url_password": [
        (
            ["git", "clone", "https://user:pw@example.com/r.git"],
            ["git", "clone", f"https://user:{R}@example.com/r.git"],
        ),
        (["git", "clone", "https://user@example.com/r.git"], ["git", "clone", "https://user@example.com/r.git"]),
    ],
    # rule: the argument after a secret-looking option
    "next_argument": [
        (["mysql", "--password", "hunter2", "db"], ["mysql", "--password", R, "db"]),
        (["gh", "--api-key", "abc", "--verbose"], ["gh", "--api-key", R, "--verbose"]),
    ],
}


@pytest.mark.parametrize(
    "rule,argv,expected",
    [
        pytest.param(rule, argv, expected, id=f"{rule}-{i}")
        for rule, cases in CASES.items()
        for i, (argv, expected) in enumerate(cases)
    ],
)
def test_each_rule_has_an_input_only_it_catches(rule, argv, expected):
    assert redact_argv(argv) == expected


def test_the_header_rule_takes_authorization_bearer_whole():
    """``Authorization: Bearer x`` (one argument, or after -H): the header rule hides the scheme too."""
    assert redact_argv(["Authorization: Bearer abc.def"]) == [f"Authorization: {R}"]
    assert redact_argv(["curl", "-H", "Authorization: Bearer x"]) == ["curl", "-H", f"Authorization: {R}"]


def test_plain_arguments_are_kept():
    argv = ["echo", "bearer", "token", "--verbose", "a=b", "https://example.com/x?y=1", "-H", "Accept: text/plain"]
    assert redact_argv(argv) == argv
