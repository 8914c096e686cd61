"""Bridges from other agent frameworks onto dormant's stores.

Each bridge is a module of its own with an optional extra (``dormant.bridges.adk``: ``pip install
'dormant[adk]'``). Nothing else in dormant imports a bridge or the framework it bridges (``lint-imports``
holds that), so dormant without the extra never loads it.
"""
