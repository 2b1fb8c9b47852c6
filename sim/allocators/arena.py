"""Back-compat re-export: the arenas live in :mod:`.placement`; ``Arena`` is first-fit."""

from __future__ import annotations

from sim.allocators.placement import BestFitArena, BuddyArena, FirstFitArena, make_arena

Arena = FirstFitArena

__all__ = ["Arena", "BestFitArena", "BuddyArena", "FirstFitArena", "make_arena"]
