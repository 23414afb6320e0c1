"""The cookbook's environments, registered in ENV through the public registry (``docs/envs.md``):

- ``arithmetic``        a single-turn answer task scored by a reward fn (:mod:`.arithmetic`)
- ``calculator``        arithmetic with a calculator tool, over several turns (:mod:`.calculator`)
- ``twenty_questions``  find a word by yes/no questions a frozen answerer model answers, and its
                        task source (:mod:`.twenty_questions`)
"""

from cookbook.envs import arithmetic, calculator, twenty_questions  # noqa: F401  (importing registers)
