"""The documented code runs and says what the code gives: the mechanisms example, which the
README points to in docs/guides/MECHANISMS.md."""

import re

import pytest

from tests.support import REPO

GUIDE = "docs/guides/MECHANISMS.md"
TEXT = (REPO / GUIDE).read_text()


def python_block(containing: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", TEXT, re.DOTALL):
        if containing in block:
            return block
    raise LookupError(containing)


def test_the_mechanisms_example_runs_and_its_comments_are_the_values():
    code = python_block("PolarOGPM(epsilon=7.28")
    scope: dict = {}
    exec(compile(code, GUIDE, "exec"), scope)  # noqa: S102 (our own documentation)
    polar = re.search(r"p\.epsilon_radius, p\.epsilon_angle\s+# \(([\d.]+), ([\d.]+)\)", code)
    stated = tuple(map(float, polar.groups()))
    digits = len(polar.group(1).split(".")[1])
    assert stated == (round(scope["p"].epsilon_radius, digits),
                      round(scope["p"].epsilon_angle, digits))
    error = re.search(r"m\.worst_case_error\(2\)\s+# ([\d.]+) \* 16", code)
    assert scope["m"].worst_case_error(2) / 16 == pytest.approx(float(error.group(1)),
                                                                abs=1e-5)
