"""trinity-like: reinforcement fine-tuning of language models, from a laptop CPU to a cluster.

The core never imports the first-party ``algorithms`` pack or any plugin: every
component it runs is looked up by name in :mod:`trinity_like.registry`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trinity-like")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
