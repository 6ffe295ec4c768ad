"""`inferflux router`: a thin async HTTP proxy in front of several `inferflux serve`
replicas, routing by prefix affinity and load (issue 19; docs/scaling.md).

Imports no serving layer (api, engine, scheduler, security, models): it only moves
bytes, reads replicas' health and load over HTTP, and keys prompts by their text.
"""

from inferflux.router.app import RouterApp
from inferflux.router.prefix_index import PrefixIndex, affinity_text, prompt_blocks
from inferflux.router.replicas import Pick, PromptKey, Replica, ReplicaPicker

__all__ = [
    "Pick",
    "PrefixIndex",
    "PromptKey",
    "Replica",
    "ReplicaPicker",
    "RouterApp",
    "affinity_text",
    "prompt_blocks",
]
