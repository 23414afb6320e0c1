"""``trinity-like compare``: is one objective better than another, beyond seed noise?

Runs every entry (a recipe, or a client script) at the same seeds, as ``trinity-like run``
subprocesses (:mod:`.scheduler`: as many at once as cores and memory allow; finished runs
reused, unfinished ones resumed), reads each run's metrics back (:mod:`.results`), and
reports per entry the mean and 95 % Student-t interval over seeds, the difference against
the first entry paired by seed with its interval, p-value and verdict (:mod:`.stats`), the
resolved keys the entries differ in (:mod:`.plans`), curves (:mod:`.plot`) and
``compare.md`` / ``compare.json`` (:mod:`.report`). See ``docs/compare.md``.
"""
