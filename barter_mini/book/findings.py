"""How a chapter hands its one-sentence answer to the introduction (:func:`glue_headline`)."""

from __future__ import annotations


def glue_headline(key: str, markdown: str) -> None:
    """Glue a chapter's one-sentence answer (inline Markdown) under ``key`` as HTML, the form
    MyST-NB pastes into another page: the introduction shows it with
    ``{glue:any}`../notebooks/CHAPTER.ipynb::KEY```, so its findings are this build's own and
    never typed."""
    from IPython.display import HTML
    from markdown_it import MarkdownIt
    from myst_nb import glue

    glue(key, HTML(MarkdownIt("commonmark").renderInline(markdown)), display=False)
