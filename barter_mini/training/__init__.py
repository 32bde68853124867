"""Training runs: the method registry, the trainer, recipes (Table 5), datasets, checkpoint
I/O, export to the smallest dense form, and the run cache.

Imports ``core`` and ``masked``; never ``measure`` or ``book``."""
