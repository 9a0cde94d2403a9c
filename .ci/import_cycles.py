"""Fail on any import cycle between hetpatrol modules (imports inside functions and
under TYPE_CHECKING count): the layers contract in .importlinter names the modules it
knows; this catches a cycle through one it does not list. Run against a real install."""

import sys

import grimp

graph = grimp.build_graph("hetpatrol")
cycles = set()
for module in sorted(graph.modules):
    for imported in graph.find_modules_directly_imported_by(module):
        back = graph.find_shortest_chain(importer=imported, imported=module)
        if back:
            cycles.add(" -> ".join((module, *back)))
for cycle in sorted(cycles):
    print(f"import cycle: {cycle}")
print(f"{len(graph.modules)} modules, {len(cycles)} import cycle(s)")
sys.exit(1 if cycles else 0)
