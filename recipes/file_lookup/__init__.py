"""The file-lookup recipe: read a value from a workspace file with the shell tool, write it to ``answer.txt``.

``generate`` writes the task splits, ``grade`` is the grader shipped into each task, ``expert`` produces scripted
demonstrations (perfect and imperfect) through the proxy; ``recipe.yaml`` describes the staged pipeline.
"""
