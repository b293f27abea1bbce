"""Long-term memory: the history archive, consolidation and Dream."""
