"""Hand-made probes: pairs of responses to one task whose right order is known by construction.

Each probe turns a task with a numeric reference answer ``a`` into a (first, second) pair
of responses; the check reports how often the reward model scores ``first`` above
``second`` (ties count one half). A rate near 1 is the wanted behaviour for every probe but
``long_vs_short``, where both responses are right and a rate far from 0.5 shows a length
bias a policy can exploit.

==================================  ==============================  ===========================
probe                               first (should win)              second
==================================  ==============================  ===========================
``right_vs_off_by_one``             ``a``                           ``a + 1``
``right_vs_empty``                  ``a``                           the empty response
``right_sentence_vs_wrong_sentence`` ``The answer is a.``           ``The answer is a + 1.``
``right_number_vs_wrong_sentence``  ``a``                           ``The answer is a + 1.``
``right_sentence_vs_wrong_number``  ``The answer is a.``            ``a + 1``
``long_vs_short``                   a long sentence ending in ``a`` ``a`` (both right)
==================================  ==============================  ===========================
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"-?\d+")


def _sentence(value: int) -> str:
    return f"The answer is {value}."


def _long(value: int) -> str:
    return (
        f"Let me work this out step by step. I add the two numbers carefully and check the result "
        f"once more, so the final answer is {value}."
    )


PROBES = {
    "right_vs_off_by_one": lambda a: (str(a), str(a + 1)),
    "right_vs_empty": lambda a: (str(a), ""),
    "right_sentence_vs_wrong_sentence": lambda a: (_sentence(a), _sentence(a + 1)),
    "right_number_vs_wrong_sentence": lambda a: (str(a), _sentence(a + 1)),
    "right_sentence_vs_wrong_number": lambda a: (_sentence(a), str(a + 1)),
    "long_vs_short": lambda a: (_long(a), str(a)),
}


def probe_pairs(answer: str) -> dict[str, tuple[str, str]] | None:
    """Every probe's (first, second) for a task whose answer is an integer; None otherwise.

    >>> probe_pairs("12")["right_vs_off_by_one"]
    ('12', '13')
    >>> probe_pairs("x = 2") is None
    True
    """
    text = answer.strip()
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    return {name: make(value) for name, make in PROBES.items()}
