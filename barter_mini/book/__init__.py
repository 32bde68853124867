"""The book layer: notebook profiles, grids of cached runs and their tables, figures, the
walkthrough helpers and the Jupyter Book build. Needs the ``book`` extra."""
