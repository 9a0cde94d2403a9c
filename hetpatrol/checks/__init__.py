"""Check families: one module per family, each a pure judge with its config section.

See :mod:`hetpatrol.checks.facts` for the shape of a family and
:mod:`hetpatrol.checks.registry` for the list the patrol runs.
"""
