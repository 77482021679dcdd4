"""Orchard-SWE: fix a bug in a real repository; graded with SWE-bench semantics (hidden tests applied afterwards).

``instance`` is the task record and its loaders (SWE-bench / SWE-Gym instance files, the local suite),
``build`` writes Orchard task directories from the local suite, ``grade`` is the stdlib-only grader shipped into
every task. The suite itself lives in ``suite/`` (layout: ``README.md``).
"""
