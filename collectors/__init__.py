"""Built-in vendor collector plugins, importable as ``hetpatrol.collectors.*``.

Each plugin registers in the ``hetpatrol.collectors`` entry-point group and subclasses
:class:`hetpatrol.collector.Collector`.
"""
