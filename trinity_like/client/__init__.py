"""A Tinker-style client for trinity_like: renderers (chat messages <-> exact token ids) and,
in later modules, training and sampling clients that take ``tinker.types`` objects.

Import the submodules you need, e.g. ``from trinity_like.client.renderers import get_renderer``;
this package imports nothing heavy on its own.
"""
